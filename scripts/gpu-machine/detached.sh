# Sourced by the detached GPU drivers (gpu_grad.sh, gpu_check_timing.sh): their work outlives one
# device call while the machine stays warm. The caller sets LOGS and defines pack() (summary and
# tarball into $OUT), then calls `detached "$@"`:
#   --background      start "$0 run" in its own session (log: $LOGS/driver.txt) and return
#   --collect SECONDS wait up to SECONDS for that driver, then pack
# Anything else returns, and the caller runs its work.
detached() {
  case ${1:-} in
    --background)
      setsid nohup bash "$0" run > "$LOGS/driver.txt" 2>&1 < /dev/null &
      echo $! > "$LOGS/driver.pid"; echo "started driver $!"; exit 0 ;;
    --collect)
      for _ in $(seq "${2:-540}"); do kill -0 "$(cat "$LOGS/driver.pid")" 2>/dev/null || break; sleep 1; done
      pack; exit 0 ;;
  esac
}
