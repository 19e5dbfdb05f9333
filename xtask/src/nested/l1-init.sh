#!/busybox/sh
# /init of the nested tier's L1 (`cargo xtask nested`): a Debian kernel under QEMU TCG with
# AMD SVM + NPT. It loads kvm_amd, checks /dev/kvm, runs the steps in /nested/steps.sh (each
# under a deadline) and powers off. Everything it says goes to the second serial port, which
# the host reads live: `@@nested` lines are the protocol (heartbeat, step begin/end, fatal,
# done); the rest is the steps' own output. The kernel's console is the first serial port.
export PATH=/busybox:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root TMPDIR=/tmp RUST_BACKTRACE=1 LANG=C.UTF-8

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
exec >/dev/ttyS1 2>&1 </dev/null

uptime_s() { cut -d' ' -f1 /proc/uptime; }
# Each protocol line starts on a line of its own, whatever a step left unfinished before it.
say() { printf '\n@@nested %s\n' "$*"; }
fatal() {
	say "fatal $*"
	sync
	poweroff -f
	sleep 60
}

mkdir -p /dev/pts /dev/shm /tmp /run /root /sys/fs/cgroup
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
# No tmpfs over /tmp or /run: the workspace's files are packed at their host paths, which may
# lie under either (a CI clone in /tmp), and a mount would hide them. The root this initramfs
# unpacked into is a writable tmpfs already.
chmod 1777 /tmp
mount -t cgroup2 cgroup2 /sys/fs/cgroup || fatal "cannot mount cgroup2"
mount -t debugfs debugfs /sys/kernel/debug || fatal "cannot mount debugfs"
ip link set lo up || fatal "cannot bring loopback up"

# Proof of life for the host's watchdog: a frozen L1 stops saying this.
(while :; do say "heartbeat $(uptime_s)"; sleep 5; done) &

say "booted $(uname -r) at $(uptime_s) s; cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
grep -qw svm /proc/cpuinfo || fatal "no-kvm: the CPU QEMU emulates has no svm flag"

# Modules in dependency order (/nested/modules.list, one name a line); kvm_amd's parameters come
# from the kernel command line (L1_KVM_AMD=npt=1,nested=1).
while read -r name; do
	[ -n "$name" ] || continue
	params=
	[ "$name" = kvm_amd ] && params=$(echo "${L1_KVM_AMD:-}" | tr ',' ' ')
	insmod "/nested/modules/$name.ko" $params || fatal "no-kvm: insmod $name $params failed: $(dmesg | tail -n 5 | tr '\n' '|')"
done </nested/modules.list
[ -c /dev/kvm ] || fatal "no-kvm: /dev/kvm is missing after kvm_amd loaded: $(dmesg | grep -i -e kvm -e svm | tail -n 8 | tr '\n' '|')"
params=
for p in npt nested nrips avic vgif vls; do
	[ -r /sys/module/kvm_amd/parameters/$p ] && params="$params $p=$(cat /sys/module/kvm_amd/parameters/$p)"
done
say "kvm ready at $(uptime_s) s: kvm_amd$params"

passed=0
failed=0
# step NAME SECONDS COMMAND...: runs COMMAND with a deadline; its status is the step's verdict.
step() {
	name=$1
	seconds=$2
	shift 2
	say "step-begin $name"
	t0=$(uptime_s)
	timeout -s KILL "$seconds" "$@"
	rc=$?
	t1=$(uptime_s)
	elapsed=$(awk "BEGIN { printf \"%.1f\", $t1 - $t0 }")
	if [ $rc -eq 0 ]; then
		passed=$((passed + 1))
	else
		failed=$((failed + 1))
		echo "--- L1 dmesg, last 40 lines, after step $name failed (status $rc) ---"
		dmesg | tail -n 40
		echo "--- end of L1 dmesg ---"
	fi
	say "step-end $name rc=$rc seconds=$elapsed limit=$seconds"
}

cd /
. /nested/steps.sh
say "done passed=$passed failed=$failed at $(uptime_s) s"
sync
poweroff -f
sleep 60
