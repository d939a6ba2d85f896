# Shared by kernel-demo/run-qemu.sh and kernel-demo/aarch64/run-qemu.sh
# (sourced, not run): installing what a boot needs on a fresh machine.

# Installs Debian package $2 unless command $1 exists.
need() {
  command -v "$1" >/dev/null && return
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "run-qemu.sh: installing $2" >&2
  $sudo apt-get install -y "$2" || { $sudo apt-get update && $sudo apt-get install -y "$2"; }
}

# Adds rustup target $1 unless it is installed.
need_target() {
  if command -v rustup >/dev/null && ! rustup target list --installed | grep -qx "$1"; then
    rustup target add "$1"
  fi
}
