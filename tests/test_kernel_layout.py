"""The layout facts the launchers take from ``cupy_kernels/layout.py`` agree with the CUDA sources.

A host program, generated from the Python tables and compiled with nvcc (no GPU needed: it only
prints), reports what the compiler makes of the CUDA side: ``sizeof`` / ``offsetof`` and the type
of every field of ``gdn::Params`` (``recurrent.cu``), the codes and bits the recurrent kernel reads,
the chunked kernels' constants, and ``gdn_layout::*_smem_bytes`` (``chunk_common.cuh``) over a grid
of shapes that covers every form the launcher picks. Each line is compared with the Python value.
"""

from __future__ import annotations

import itertools
import shutil
import subprocess
from pathlib import Path

import pytest

from cupy_kernels import layout

KERNELS = Path(__file__).resolve().parent.parent / "cupy_kernels"
NVCC = shutil.which("nvcc")

CHUNK_SIZES = (16, 32, 64)
HEAD_SIZES = (1, 7, 16, 60, 64, 100, 128, 200, 256)
FUSED_K = tuple(range(16, layout.FUSED_MAX_K + 1, 16))
FUSED_FORMS = ((1, 1), (2, 1), (4, 1), (2, 2))
WGMMA_K = (64, 128)


def expected() -> dict[str, str]:
    """What the host program must print, line by line (``name value``), from the Python side."""
    want = {"sizeof(Params)": str(layout.PARAMS_SIZE)}
    for name, ctype in layout.PARAMS:
        want[f"offsetof({name})"] = str(layout.OFFSETS[name])
        want[f"type({name})"] = ctype
    facts = {**layout.DTYPES, **layout.MODES, **layout.FLAGS, **layout.ERRORS, "ERR_WORDS": layout.ERR_WORDS}
    want.update({f"gdn::{name}": str(value) for name, value in facts.items()})
    want.update({name: str(value) for name, value in layout.CHUNK_CONSTANTS.items()})
    for C, K, V in itertools.product(CHUNK_SIZES, HEAD_SIZES, HEAD_SIZES):
        want[f"chunk_intra({C},{K},{V})"] = str(layout.chunk_intra_smem(C, K, V))
    for C, K, tc in itertools.product(CHUNK_SIZES, HEAD_SIZES, (0, 1)):
        want[f"chunk_state({C},{K},{tc})"] = str(layout.chunk_state_smem(C, K, bool(tc)))
    for C, K in itertools.product(CHUNK_SIZES, HEAD_SIZES):
        want[f"chunk_output({C},{K})"] = str(layout.chunk_output_smem(C, K))
    for K in FUSED_K:
        want[f"fused_prep({K})"] = str(layout.fused_prep_smem(K))
        for W, KS in FUSED_FORMS:
            want[f"fused_state({K},{W},{KS})"] = str(layout.fused_state_smem(K, W, KS))
    for K in WGMMA_K:
        want[f"wgmma_state({K})"] = str(layout.wgmma_state_smem(K))
    return want


def program() -> str:
    """The host program: includes the real sources, prints every fact :func:`expected` names."""
    out = [
        "#define GDN_NO_INSTANTIATE  // recurrent.cu: Params only, no kernel instantiations",
        "#include <cstddef>",
        "#include <cstdio>",
        "#include <type_traits>",
        '#include "recurrent.cu"',
        '#include "chunk_common.cuh"',
        "",
        "template <typename T> const char* ctype() {",
        '    if (std::is_pointer<T>::value) return "pointer";',
        '    if (std::is_same<T, long long>::value) return "long long";',
        '    if (std::is_same<T, int>::value) return "int";',
        '    if (std::is_same<T, float>::value) return "float";',
        '    if (std::is_same<T, double>::value) return "double";',
        '    return "unknown";',
        "}",
        'static void put(const char* name, long long value) { std::printf("%s %lld\\n", name, value); }',
        "",
        "int main() {",
        '    put("sizeof(Params)", sizeof(gdn::Params));',
    ]
    for name, _ in layout.PARAMS:
        out.append(f'    put("offsetof({name})", offsetof(gdn::Params, {name}));')
        out.append(f'    std::printf("type({name}) %s\\n", ctype<decltype(gdn::Params::{name})>());')
    facts = [*layout.DTYPES, *layout.MODES, *layout.FLAGS, *layout.ERRORS, "ERR_WORDS"]
    out += [f'    put("gdn::{name}", gdn::{name});' for name in facts]
    out += [f'    put("{name}", {name});' for name in layout.CHUNK_CONSTANTS]

    def ints(values: tuple[int, ...]) -> str:
        return "{" + ", ".join(map(str, values)) + "}"

    out += [
        f"    const int Cs[] = {ints(CHUNK_SIZES)}, Hs[] = {ints(HEAD_SIZES)}, FK[] = {ints(FUSED_K)};",
        f"    const int WK[] = {ints(WGMMA_K)}, FW[] = {ints(tuple(w for w, _ in FUSED_FORMS))};",
        f"    const int FS[] = {ints(tuple(ks for _, ks in FUSED_FORMS))};",
        "    char name[64];",
        "    for (int C : Cs) for (int K : Hs) {",
        "        for (int V : Hs) {",
        '            std::snprintf(name, sizeof name, "chunk_intra(%d,%d,%d)", C, K, V);',
        "            put(name, gdn_layout::chunk_intra_smem_bytes(C, K, V));",
        "        }",
        "        for (int tc = 0; tc < 2; ++tc) {",
        '            std::snprintf(name, sizeof name, "chunk_state(%d,%d,%d)", C, K, tc);',
        "            put(name, gdn_layout::chunk_state_smem_bytes(C, K, tc != 0));",
        "        }",
        '        std::snprintf(name, sizeof name, "chunk_output(%d,%d)", C, K);',
        "        put(name, gdn_layout::chunk_output_smem_bytes(C, K));",
        "    }",
        "    for (int K : FK) {",
        '        std::snprintf(name, sizeof name, "fused_prep(%d)", K);',
        "        put(name, gdn_layout::fused_prep_smem_bytes(K));",
        f"        for (int f = 0; f < {len(FUSED_FORMS)}; ++f) {{",
        '            std::snprintf(name, sizeof name, "fused_state(%d,%d,%d)", K, FW[f], FS[f]);',
        "            put(name, gdn_layout::fused_state_smem_bytes(K, FW[f], FS[f]));",
        "        }",
        "    }",
        "    for (int K : WK) {",
        '        std::snprintf(name, sizeof name, "wgmma_state(%d)", K);',
        "        put(name, gdn_layout::wgmma_state_smem_bytes(K));",
        "    }",
        "    return 0;",
        "}",
    ]
    return "\n".join(out) + "\n"


@pytest.fixture(scope="module")
def printed(tmp_path_factory) -> dict[str, str]:
    if NVCC is None:
        pytest.skip("nvcc is not on PATH: the CUDA side of the layout is not compiled")
    tmp = tmp_path_factory.mktemp("layout")
    (tmp / "layout.cu").write_text(program())
    exe = tmp / "layout"
    cmd = [NVCC, "-std=c++17", "-arch=sm_90", f"-I{KERNELS}", str(tmp / "layout.cu"), "-o", str(exe)]
    built = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    return dict(line.split(" ", 1) for line in run.stdout.splitlines())


def test_params_layout_matches_recurrent_cu(printed):
    want = {n: v for n, v in expected().items() if n.startswith(("sizeof(", "offsetof(", "type("))}
    got = {n: printed.get(n) for n in want}
    assert got == want


def test_kernel_codes_and_constants_match(printed):
    want = {n: v for n, v in expected().items() if n.startswith("gdn")}
    got = {n: printed.get(n) for n in want}
    assert got == want


def test_shared_memory_sizes_match_chunk_common_cuh(printed):
    want = {n: v for n, v in expected().items() if "(" in n and not n.startswith(("sizeof(", "offsetof(", "type("))}
    got = {n: printed.get(n) for n in want}
    assert got == want
    assert len(want) > 300  # the grid really was printed


def test_host_program_prints_only_what_python_knows(printed):
    assert set(printed) == set(expected())


def test_params_structs_cover_the_layout():
    """POINTERS then SCALARS are Params byte for byte; pack_scalars packs by field name."""
    assert layout.POINTERS.size == layout.OFFSETS[layout.SCALAR_FIELDS[0]]
    assert layout.POINTERS.size + layout.SCALARS.size == layout.PARAMS_SIZE
    values = {name: i for i, name in enumerate(layout.SCALAR_FIELDS)}
    values["scale"] = 0.25
    raw = bytes(layout.POINTERS.size) + layout.pack_scalars(values)
    back = layout.unpack_params(raw)
    assert {name: back[name] for name in layout.SCALAR_FIELDS} == values
    with pytest.raises(KeyError, match="missing"):
        layout.pack_scalars({k: v for k, v in values.items() if k != "flags"})
