# Sourced (not run) by the GPU scripts that run from the repository root on the device machine
# (gpu_session.sh, gpu_checks.sh). After `. scripts/gpu-machine/common.sh`:
# - PYTHONPATH names the checkout, then $SITE (default /tmp/site) where it exists, and CuTe DSL's
#   package folder when a FlashInfer site is unpacked there (`--target` installs run no .pth files);
# - carried wheels (.whl/*.whl, .whl/fla/*.whl: FLA) are installed into $SITE once per machine
#   (skipped when $SITE/fla exists, so that phases running side by side do not install twice);
# - GDN_VERIFY_VLLM_OPS names .whl/vllm_fla (vLLM's kernel files) when it was carried;
# - describe_machine prints the date, the GPU and the library versions (for a report's header).
# scripts/gpu-machine/README.md says how the .whl/ bundles are built (scripts/gpu-machine/pack_carried.sh fla, fqla, flashinfer, vllm).
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
SITE=${SITE:-/tmp/site}
install_wheels() {
  local wheels
  wheels=$(ls .whl/*.whl .whl/fla/*.whl 2>/dev/null | tr '\n' ' ')
  if [ -n "$wheels" ] && [ ! -d "$SITE/fla" ]; then
    # shellcheck disable=SC2086
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" $wheels
  fi
}
install_wheels
[ -d "$SITE" ] && export PYTHONPATH="$PYTHONPATH:$SITE"
[ -d "$SITE/nvidia_cutlass_dsl/dsl_packages" ] && export PYTHONPATH="$PYTHONPATH:$SITE/nvidia_cutlass_dsl/dsl_packages"
[ -d .whl/vllm_fla ] && export GDN_VERIFY_VLLM_OPS=${GDN_VERIFY_VLLM_OPS:-$PWD/.whl/vllm_fla}
describe_machine() {
  date -u
  git rev-parse --short HEAD 2>/dev/null
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  compute-sanitizer --version 2>/dev/null | tail -n 1
  python3 - <<'EOF'
import importlib.metadata as md
for p in ("torch", "triton", "cupy-cuda13x", "cupy-cuda12x", "numpy", "hypothesis", "fla-core", "flashinfer-python",
          "nvidia-cutlass-dsl", "apache-tvm-ffi", "cuda-bindings"):
    try:
        print(p, md.version(p))
    except md.PackageNotFoundError:
        pass
EOF
  [ -n "${GDN_VERIFY_VLLM_OPS:-}" ] && head -n 1 "$GDN_VERIFY_VLLM_OPS/MANIFEST.txt" 2>/dev/null
  return 0
}
