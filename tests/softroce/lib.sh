# shellcheck shell=bash
# Shared by setup, guest, pair, cluster, compare and critpath: where things
# live, how one guest boots, how several guests share virtual switches, and
# which device and GID the benchmarks use.
# Sourced, never run. Every function is prefixed sr_.

SR_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SR_CACHE=${VERBS_SOFTROCE_CACHE:-$HOME/.cache/verbs-softroce}

# apt packages a fresh Debian/Ubuntu host needs (iproute2 gives ip/tc/rdma,
# which the guest runs from the host root through the chroot; vde-switch is
# the virtual switch of a cluster of 3 guests or more).
# shellcheck disable=SC2034 # used by setup
SR_PACKAGES=(qemu-system-x86 busybox-static rdma-core ibverbs-providers
	ibverbs-utils libibverbs-dev librdmacm-dev rdmacm-utils perftest iproute2
	xz-utils vde-switch make)

# insmod order: each module's depends= is satisfied by the ones before it.
# ifb .. act_mirred: netem on a NIC's incoming side (a node's whole link).
SR_MODULES=(virtio_ring virtio virtio_pci_legacy_dev virtio_pci_modern_dev
	virtio_pci netfs fscache 9pnet 9pnet_virtio 9p
	failover net_failover virtio_net dummy sch_netem
	ifb sch_ingress cls_matchall act_mirred
	crc32_generic udp_tunnel ip6_udp_tunnel ib_core ib_uverbs
	configfs iw_cm ib_cm rdma_cm rdma_ucm rdma_rxe
	crc32c_generic libcrc32c siw)

# Modules Debian's kernel does not ship (CONFIG_RDMA_SIW is off in its
# 6.1 and 6.12 configs): each one's directory in the kernel's source and
# its config symbol. setup builds them from the source package of the
# very kernel it downloaded, against that kernel's headers.
# shellcheck disable=SC2034 # used by setup
declare -gA SR_BUILT_MODULES=([siw]="drivers/infiniband/sw/siw CONFIG_RDMA_SIW")

sr_say() { printf 'softroce %s: %s\n' "${SR_WHO:-}" "$*" >&2; }
sr_die() { sr_say "$*"; exit 125; }

# What the initramfs is built from; guest compares it with the stamp setup left.
sr_init_hash() {
	{ cat "$SR_DIR/init"; echo "${SR_MODULES[*]}"; } | sha256sum | cut -c1-16
}

# True when setup has produced a kernel + initramfs matching this checkout.
sr_ready() {
	local stamp
	[[ -r $SR_CACHE/kernel && -r $SR_CACHE/initramfs.cpio.gz ]] || return 1
	read -r stamp _ <"$SR_CACHE/initramfs.stamp" 2>/dev/null || return 1
	[[ $stamp == "$(sr_init_hash)" ]]
}

sr_ensure_ready() {
	sr_ready && return 0
	sr_say "kernel/initramfs missing or stale; running setup"
	"$SR_DIR/setup" >&2 || sr_die "setup failed"
}

# A host RDMA device usable directly (prints its name), unless forced to a guest.
sr_host_device() {
	[[ ${VERBS_FORCE_GUEST:-0} != 1 ]] || return 1
	compgen -G '/sys/class/infiniband/*' >/dev/null || return 1
	command -v ibv_devices >/dev/null || return 1
	ibv_devices 2>/dev/null | awk 'NR > 2 && NF { print $1; found = 1; exit } END { exit !found }'
}

# The device the benchmarks use (VERBS_TEST_DEVICE, else the first) and
# its GID index: RoCE v2 with an IPv4-mapped address first, else 0
# (InfiniBand, or a link-local-only table). Prints "DEVICE INDEX".
sr_bench_device() {
	local dev f i type
	dev=${VERBS_TEST_DEVICE:-$(find /sys/class/infiniband/ -mindepth 1 -maxdepth 1 -printf '%f\n' | sort | head -n1)}
	for f in /sys/class/infiniband/"$dev"/ports/1/gids/*; do
		i=${f##*/}
		type=$(cat "/sys/class/infiniband/$dev/ports/1/gid_attrs/types/$i" 2>/dev/null || true)
		if [[ $(cat "$f") == 0000:0000:0000:0000:0000:ffff:* && $type == "RoCE v2" ]]; then
			echo "$dev $i"
			return
		fi
	done
	echo "$dev 0"
}

# Waits until something listens on TCP PORT, for at most 20 s: neither
# perftest nor perf retries a client that came before its server.
sr_wait_listen() {
	local n=0
	until ss -ltn 2>/dev/null | grep -q ":$1 "; do
		((n++ < 400)) || return 0
		sleep 0.05
	done
}

# Pick the accelerator. KVM hangs on some hosts, so it is probed once (with a
# time limit) and the verdict cached per host kernel.
sr_accel() {
	case ${VERBS_GUEST_ACCEL:-} in
	tcg | kvm) echo "$VERBS_GUEST_ACCEL"; return ;;
	'') ;;
	*) sr_die "VERBS_GUEST_ACCEL must be tcg or kvm" ;;
	esac
	[[ -r /dev/kvm && -w /dev/kvm ]] || { echo tcg; return; }
	local verdict
	verdict=$SR_CACHE/kvm-probe.$(uname -r)
	if [[ ! -s $verdict ]]; then
		sr_say "probing KVM (15 s limit, once per host kernel)"
		local run status=tcg
		run=$(mktemp -d "${TMPDIR:-/tmp}/softroce-probe.XXXXXX")
		echo 'SR_PROBE=1' >"$run/config"
		SR_ACCEL=kvm sr_qemu "$run" 15 &
		wait $! && [[ -e $run/started ]] && status=kvm
		rm -rf "$run"
		echo "$status" >"$verdict"
	fi
	cat "$verdict"
}

# Write the per-run control directory: config for init, the job script.
# Usage: sr_prepare RUN CMD [ARGS...]. SR_CONFIG (from sr_node_config) sets
# NICs and faults, else the lone guest's rxe0 on dummy0; SR_EXPORTS holds
# extra `export` lines for the job.
sr_prepare() {
	local run=$1 name
	shift
	# The lone guest: rxe0 on dummy0; with VERBS_TEST_DEVICE=siw0 also siw0
	# on dummy1 (its own address, so rdma_cm picks siw0 for it and rxe0 for
	# dummy0's). Only then: iWARP's listeners are real TCP sockets, so a
	# wildcard rdma_cm listen would take the port of a TCP listener beside
	# it (perf -R's server does both).
	local lone="SR_PLANES=1 SR_IF_0=dummy0 SR_ADDR_0=10.77.0.1/24"
	[[ ${VERBS_TEST_DEVICE:-} == siw0 ]] && lone+=" SR_SIW_ADDR=10.79.0.1/24"
	printf '%s\n' "${SR_CONFIG:-$lone}" >"$run/config"
	# The guest gets a fresh /tmp; host entries it needs there (a crate or a
	# target dir under /tmp, a binary in /tmp) are bound in, read-only.
	local p
	for p in "$PWD" "$@"; do
		[[ $p == /tmp/?* ]] || continue
		p=${p#/tmp/}
		p=${p%%/*}
		[[ -e /tmp/$p ]] && printf '%s\n' "$p"
	done | sort -u >"$run/tmpbinds"
	{
		echo '# generated by tests/softroce; run by bash inside the guest chroot'
		for name in $(compgen -e); do
			case $name in
			RUST_* | CARGO_* | VERBS_* | NEXTEST_* | TERM | PATH | HOME | USER | \
				LANG | LC_* | TZ | LD_LIBRARY_PATH)
				printf 'export %s=%q\n' "$name" "${!name}" ;;
			esac
		done
		# The guest's devices: rxe0 (RoCE), and siw0 (iWARP) in a lone
		# guest; a caller's VERBS_TEST_DEVICE naming one of them is kept
		# (`VERBS_TEST_DEVICE=siw0 tests/softroce/cargo test ...`).
		case ${VERBS_TEST_DEVICE:-} in
		rxe[0-9] | siw0) printf 'export VERBS_TEST_DEVICE=%q' "$VERBS_TEST_DEVICE" ;;
		*) printf 'export VERBS_TEST_DEVICE=rxe0' ;;
		esac
		echo ' VERBS_REQUIRE_DEVICE=1 VERBS_IN_GUEST=1'
		[[ -n ${SR_EXPORTS:-} ]] && printf '%s\n' "$SR_EXPORTS"
		printf 'cd %q || { echo "softroce guest: no such directory in the guest: %q" >&2; exit 125; }\n' "$PWD" "$PWD"
		printf 'exec'
		printf ' %q' "$@"
		echo
	} >"$run/job"
}

# Boot one guest in the foreground until it powers off or LIMIT seconds pass
# (0: no limit). Exit status: qemu's, or 124 on time limit. SR_NICS adds NICs: one
# "NETDEV_OPTIONS MAC" line each (pair, cluster).
sr_qemu() {
	local run=$1 limit=$2 accel=${SR_ACCEL:-tcg} cpu=max
	[[ $accel == kvm ]] && cpu=host
	# shellcheck disable=SC2054 # commas belong to QEMU option values
	local args=(
		-accel "$accel" -cpu "$cpu" -m "${VERBS_GUEST_MEM:-1G}" -smp "${VERBS_GUEST_CPUS:-2}"
		-nodefaults -no-user-config -display none -no-reboot
		-serial "file:$run/console.log"
		-kernel "$SR_CACHE/kernel" -initrd "$SR_CACHE/initramfs.cpio.gz"
		# skip checks that only cost time under emulation
		-append "console=ttyS0 panic=-1 quiet tsc=reliable no_timer_check cryptomgr.notests ${VERBS_GUEST_CMDLINE:-}"
		# host root, read-only: the guest runs the host's binaries and libraries
		-fsdev "local,id=hostfs,path=/,security_model=none,readonly=on,multidevs=remap"
		-device virtio-9p-pci,fsdev=hostfs,mount_tag=host
		# per-run directory, writable: job in, output and exit status out
		-fsdev "local,id=ctlfs,path=$run,security_model=none"
		-device virtio-9p-pci,fsdev=ctlfs,mount_tag=ctl
	)
	# qboot: a minimal firmware that starts the kernel sooner than SeaBIOS
	[[ -r /usr/share/qemu/qboot.rom ]] && args+=(-bios /usr/share/qemu/qboot.rom)
	local n=0 netdev mac
	while read -r netdev mac; do
		[[ -n $netdev ]] || continue
		args+=(-netdev "$netdev,id=n$n" -device "virtio-net-pci,netdev=n$n,mac=$mac")
		n=$((n + 1))
	done <<<"${SR_NICS:-}"
	# cluster --kill-node powers a guest off through this pid
	args+=(-pidfile "$run/qemu.pid")
	((limit)) || exec qemu-system-x86_64 "${args[@]}" </dev/null >>"$run/qemu.log" 2>&1
	# -k: a guest that ignores SIGTERM still goes away.
	exec timeout -k 5 "$limit" qemu-system-x86_64 "${args[@]}" </dev/null >>"$run/qemu.log" 2>&1
}

# Boot the guest prepared in RUN, stream its stdout/stderr (each line with
# PREFIX if given) and return CMD's status; DESC names CMD in messages.
# Kills its qemu if the shell running it is told to stop.
sr_boot() {
	local run=$1 limit=$2 prefix=$3 desc=$4 t0 qemu out err qs
	: >"$run/stdout"
	: >"$run/stderr"
	t0=$EPOCHREALTIME
	sr_qemu "$run" "$limit" &
	qemu=$!
	# Stopped from outside (pair or cluster, once another node failed): say
	# where this one was, for a hang to be told from a slow start.
	SR_BOOT=("$qemu" "$run" "$desc")
	trap 'kill "${SR_BOOT[0]}" 2>/dev/null; wait; sr_say "stopped from outside while running ${SR_BOOT[2]}"; sr_last_words "${SR_BOOT[1]}"; exit 143' TERM
	trap 'kill "${SR_BOOT[0]}" 2>/dev/null; wait; exit 130' INT
	sr_follow "$run/stdout" "$qemu" "$prefix" &
	out=$!
	sr_follow "$run/stderr" "$qemu" "$prefix" >&2 &
	err=$!
	# (2>: no "Killed" job notice when --kill-node powers the guest off)
	wait "$qemu" 2>/dev/null
	qs=$?
	wait "$out" "$err"
	trap - TERM INT
	sr_outcome "$run" "$qs" "$limit" "$t0" "$desc"
}

# Copy a growing file to stdout until process PID is gone (then drain it).
# PREFIX, when given, goes in front of every line.
sr_follow() {
	local file=$1 pid=$2 prefix=${3:-}
	if [[ -n $prefix ]]; then
		tail -n +1 -s 0.2 -f --pid="$pid" "$file" 2>/dev/null | sed -u "s/^/$prefix/"
	else
		tail -n +1 -s 0.2 -f --pid="$pid" "$file" 2>/dev/null
	fi
}

# sr_last_words RUN: what a command that did not finish said last (the
# stage it was in, when it names its stages) and the tail of its guest's
# console, on stderr.
sr_last_words() {
	local run=$1
	if [[ ! -e $run/started ]]; then
		sr_say "its command never started (the guest was still booting)"
	else
		sr_say "its last output lines:"
		tail -n 3 "$run/stdout" 2>/dev/null | sed 's/^/  stdout: /' >&2
		tail -n 3 "$run/stderr" 2>/dev/null | sed 's/^/  stderr: /' >&2
	fi
	sr_say "last console lines ($run/console.log):"
	tail -n 10 "$run/console.log" 2>/dev/null | sed 's/^/  /' >&2
}

# After qemu is gone: turn what the run directory holds into an exit status.
# Usage: sr_outcome RUN QEMU_STATUS LIMIT T0 DESCRIPTION
sr_outcome() {
	local run=$1 qs=$2 limit=$3 t0=$4 what=$5 status
	if [[ -s $run/status ]]; then
		read -r status <"$run/status"
		if [[ -n ${VERBS_GUEST_TIMING:-} ]]; then
			local started end
			started=$(stat -c %.3Y "$run/started") end=$EPOCHREALTIME
			sr_say "$(awk -v a="$t0" -v b="$started" -v c="$end" \
				'BEGIN { printf "boot-to-command %.2f s, whole cycle %.2f s", b - a, c - a }') ($SR_ACCEL)"
		fi
		return "$status"
	fi
	if [[ -e $run/killed ]]; then
		sr_say "powered off as asked (--kill-node), $(cat "$run/killed") s after its command started"
		return 137
	fi
	if ((qs == 124 || qs == 137)); then
		sr_say "time limit $limit s exceeded running $what"
		sr_last_words "$run"
		return 124
	fi
	if [[ -s $run/init-error ]]; then
		sr_say "guest set-up failed for $what: $(cat "$run/init-error")"
		sed 's/^/  /' "$run/guest-setup.log" >&2 2>/dev/null
	elif [[ -e $run/started ]]; then
		sr_say "guest died while running $what (qemu status $qs)"
	else
		sr_say "guest failed to boot for $what (qemu status $qs)"
	fi
	sr_say "last console lines ($run/console.log):"
	tail -n 25 "$run/console.log" >&2 2>/dev/null
	tail -n 5 "$run/qemu.log" >&2 2>/dev/null
	# shellcheck disable=SC2034 # read by the caller
	SR_KEEP=1
	return 125
}

# --- Several guests on virtual switches: pair and cluster ----------------------
# Plane p is one vde_switch (a learning switch on unix sockets: no IP traffic
# leaves the host). Node i plugs NIC eth<p> into it, with address
# 10.(78+p).0.(i+1)/24, and rxe<p> runs on that NIC. Two nodes get a plain
# wire per plane instead: a unix stream socket between their QEMUs, which
# pushes back on a busy receiver where a datagram switch drops frames.

sr_addr() { echo "10.$((78 + $1)).0.$(($2 + 1))"; }                        # PLANE NODE
sr_mac() { printf '52:54:00:%02x:00:%02x\n' $((0x78 + $1)) $(($2 + 1)); } # PLANE NODE

# Topology and faults, set from the command line by sr_net_opt.
SR_PLANES=1 SR_LOSS='' SR_LOSS_NODE='' SR_LOSS_PLANE='' SR_DELAY='' SR_DELAY_NODE='' SR_DELAY_PLANE=''
SR_CUT_AFTER='' SR_CUT_PLANE='' SR_CUT_NODE='' SR_RESTORE_AFTER='' SR_KILL_NODE='' SR_KILL_AFTER=''
SR_TOP='' SR_WIRE='' SR_PIDS=() SR_HELPERS=() SR_SWITCH_PIDS=()
declare -A SR_RUN_OF=()

# sr_net_opt OPTION VALUE: take one topology or fault option; false if
# OPTION is not one.
sr_net_opt() {
	case $1 in
	--planes) SR_PLANES=${2-} ;;
	--loss) SR_LOSS=${2-} ;;
	--loss-node) SR_LOSS_NODE=${2-} ;;
	--loss-plane) SR_LOSS_PLANE=${2-} ;;
	--delay) SR_DELAY=${2-} ;;
	--delay-node) SR_DELAY_NODE=${2-} ;;
	--delay-plane) SR_DELAY_PLANE=${2-} ;;
	--cut-after) SR_CUT_AFTER=${2-} ;;
	--cut-plane) SR_CUT_PLANE=${2-} ;;
	--cut-node) SR_CUT_NODE=${2-} ;;
	--restore-after) SR_RESTORE_AFTER=${2-} ;;
	--kill-node) SR_KILL_NODE=${2-} ;;
	--kill-after) SR_KILL_AFTER=${2-} ;;
	*) return 1 ;;
	esac
	[[ ${2-} =~ ^[0-9]+(\.[0-9]+)?$ ]] || sr_die "$1 needs a number, not '${2-}'"
}

# sr_net_check N: the options make sense for N nodes.
sr_net_check() {
	local n=$1 v
	for v in SR_PLANES SR_LOSS_NODE SR_DELAY_NODE SR_CUT_NODE SR_KILL_NODE \
		SR_LOSS_PLANE SR_DELAY_PLANE SR_CUT_PLANE; do
		[[ ${!v} =~ ^[0-9]*$ ]] || sr_die "node and plane numbers are whole numbers"
	done
	((SR_PLANES >= 1 && SR_PLANES <= 8)) || sr_die "--planes takes 1 to 8"
	for v in SR_LOSS_NODE SR_DELAY_NODE SR_CUT_NODE SR_KILL_NODE; do
		[[ -z ${!v} ]] || ((${!v} < n)) || sr_die "there is no node ${!v} (nodes are 0..$((n - 1)))"
	done
	for v in SR_LOSS_PLANE SR_DELAY_PLANE SR_CUT_PLANE; do
		[[ -z ${!v} ]] || ((${!v} < SR_PLANES)) || sr_die "there is no plane ${!v} (planes are 0..$((SR_PLANES - 1)))"
	done
	[[ -n $SR_LOSS || -z $SR_LOSS_NODE$SR_LOSS_PLANE ]] || sr_die "--loss-node/--loss-plane need --loss"
	[[ -n $SR_DELAY || -z $SR_DELAY_NODE$SR_DELAY_PLANE ]] || sr_die "--delay-node/--delay-plane need --delay"
	[[ -n $SR_CUT_AFTER || -z $SR_CUT_NODE$SR_CUT_PLANE$SR_RESTORE_AFTER ]] ||
		sr_die "--cut-node/--cut-plane/--restore-after need --cut-after"
	[[ -z $SR_KILL_NODE$SR_KILL_AFTER || (-n $SR_KILL_NODE && -n $SR_KILL_AFTER) ]] ||
		sr_die "--kill-node and --kill-after go together"
}

# sr_netem NODE PLANE out|in: netem arguments for that NIC and direction.
# Without a node selector every node's outgoing side is impaired, so each
# packet between two nodes is hit once; with one, that node's link is
# impaired both ways (incoming through an ifb device), again once per packet.
sr_netem() {
	local args=()
	sr_hits "$@" "$SR_LOSS" "$SR_LOSS_NODE" "$SR_LOSS_PLANE" && args+=(loss "$SR_LOSS%")
	sr_hits "$@" "$SR_DELAY" "$SR_DELAY_NODE" "$SR_DELAY_PLANE" && args+=(delay "${SR_DELAY}ms")
	echo "${args[*]}"
}
# sr_hits NODE PLANE DIR VALUE NODE_SELECTOR PLANE_SELECTOR
sr_hits() {
	[[ -n $4 && (-z $6 || $6 == "$2") ]] || return 1
	[[ $5 == "$1" || (-z $5 && $3 == out) ]]
}

# sr_node_config NODE: init's config for that node (NICs, addresses, faults).
sr_node_config() {
	local i=$1 p
	printf 'SR_PLANES=%q\n' "$SR_PLANES"
	for ((p = 0; p < SR_PLANES; p++)); do
		printf 'SR_IF_%d=eth%d SR_ADDR_%d=%s/24 SR_MAC_%d=%s\n' \
			"$p" "$p" "$p" "$(sr_addr "$p" "$i")" "$p" "$(sr_mac "$p" "$i")"
		printf 'SR_NETEM_%d=%q SR_NETEM_IN_%d=%q\n' \
			"$p" "$(sr_netem "$i" "$p" out)" "$p" "$(sr_netem "$i" "$p" in)"
	done
	if [[ -n $SR_CUT_AFTER && (-z $SR_CUT_NODE || $SR_CUT_NODE == "$i") ]]; then
		printf 'SR_CUT_IF=eth%d SR_CUT_AFTER=%q SR_RESTORE_AFTER=%q\n' \
			"${SR_CUT_PLANE:-0}" "$SR_CUT_AFTER" "$SR_RESTORE_AFTER"
	fi
}

# sr_nodes_begin KIND N: the run's top directory and, for 3 nodes or more,
# one switch per plane. Each switch reads its stdin from a pipe this shell
# holds: should the script die without cleaning up, the switch gets EOF and
# exits by itself.
sr_nodes_begin() {
	local kind=$1 n=$2 p fd
	SR_TOP=$(mktemp -d "${TMPDIR:-/tmp}/softroce-$kind.XXXXXX") || sr_die "no temp dir"
	SR_WIRE=stream
	((n == 2)) && return
	SR_WIRE=vde
	command -v vde_switch >/dev/null ||
		sr_die "vde_switch not found (Debian package vde-switch; tests/softroce/setup installs it)"
	for ((p = 0; p < SR_PLANES; p++)); do
		# shellcheck disable=SC2034 # fd is only held, never written
		exec {fd}> >(exec vde_switch -n $((n < 32 ? 32 : n + 1)) -s "$SR_TOP/sw$p" >"$SR_TOP/sw$p.log" 2>&1)
		SR_SWITCH_PIDS+=($!)
	done
	for ((p = 0; p < SR_PLANES; p++)); do
		sr_wait_socket "$SR_TOP/sw$p/ctl" || sr_die "the switch of plane $p did not start: $(cat "$SR_TOP/sw$p.log")"
	done
}

# sr_wait_socket PATH: true once the unix socket PATH exists (10 s at most).
sr_wait_socket() {
	local tries
	for ((tries = 0; tries < 200; tries++)); do
		[[ -S $1 ]] && return
		sleep 0.05
	done
	return 1
}

# sr_node_start NODE NAME CMD...: boot the node in the background (run dir
# SR_TOP/NAME), its output prefixed "[NAME] ". SR_EXPORTS: extra exports.
sr_node_start() {
	local i=$1 name=$2 run p nics=
	shift 2
	run=$SR_TOP/$name
	mkdir "$run" || sr_die "cannot create $run"
	for ((p = 0; p < SR_PLANES; p++)); do
		if [[ $SR_WIRE == vde ]]; then
			nics+="vde,sock=$SR_TOP/sw$p"
		elif ((i == 0)); then
			nics+="stream,server=on,addr.type=unix,addr.path=$SR_TOP/wire$p"
		else
			nics+="stream,server=off,addr.type=unix,addr.path=$SR_TOP/wire$p"
			# node 0's QEMU must be listening, or this one exits at once
			sr_wait_socket "$SR_TOP/wire$p" || sr_die "node 0's QEMU never listened on $SR_TOP/wire$p"
		fi
		nics+=" $(sr_mac "$p" "$i")"$'\n'
	done
	SR_CONFIG=$(sr_node_config "$i") sr_prepare "$run" "$@"
	(
		SR_WHO="$SR_WHO $name" SR_NICS=$nics SR_KEEP=${VERBS_GUEST_KEEP:-}
		sr_boot "$run" "${VERBS_GUEST_TIMEOUT:-600}" "[$name] " "$*"
		status=$?
		[[ -n $SR_KEEP ]] && sr_say "kept $run" && : >"$run/keep"
		exit "$status"
	) &
	SR_PIDS+=($!)
	SR_RUN_OF[$!]=$run
	if [[ $i == "$SR_KILL_NODE" ]]; then
		sr_kill_later "$run" $! &
		SR_HELPERS+=($!)
	fi
}

# --kill-node: SIGKILL the node's qemu (a pulled plug) SR_KILL_AFTER s after
# its command started, unless the command finished first.
sr_kill_later() {
	local run=$1 node=$2
	until [[ -e $run/started ]]; do
		kill -0 "$node" 2>/dev/null || return
		sleep 0.1
	done
	sleep "$SR_KILL_AFTER"
	[[ -e $run/status ]] && return
	echo "$SR_KILL_AFTER" >"$run/killed"
	kill -KILL "$(cat "$run/qemu.pid")" 2>/dev/null
}

# sr_nodes_wait GRACE: wait for every node. Status: that of the first node
# to fail, or 0. A node failing on its own gives the others GRACE seconds
# before they are stopped; one powered off by --kill-node does not, since
# carrying on without it is what the others are being tested for.
sr_nodes_wait() {
	local grace=$1 result=0 reaper='' status finished p left
	while ((${#SR_PIDS[@]})); do
		wait -n -p finished "${SR_PIDS[@]}"
		status=$?
		left=()
		for p in "${SR_PIDS[@]}"; do [[ $p == "$finished" ]] || left+=("$p"); done
		SR_PIDS=("${left[@]}")
		((status)) || continue
		((result)) || result=$status
		if [[ -z $reaper && ! -e ${SR_RUN_OF[$finished]}/killed ]] && ((${#SR_PIDS[@]})); then
			sleep "$grace" && kill "${SR_PIDS[@]}" 2>/dev/null &
			reaper=$!
		fi
	done
	[[ -n $reaper ]] && kill "$reaper" 2>/dev/null
	return "$result"
}

# EXIT trap of pair and cluster: stop what still runs, then remove the run
# unless a node was kept for diagnosis.
sr_nodes_end() {
	((${#SR_PIDS[@]})) && kill "${SR_PIDS[@]}" 2>/dev/null
	((${#SR_HELPERS[@]})) && kill "${SR_HELPERS[@]}" 2>/dev/null
	((${#SR_SWITCH_PIDS[@]})) && kill "${SR_SWITCH_PIDS[@]}" 2>/dev/null
	wait
	[[ -n $SR_TOP ]] || return
	if [[ -n ${VERBS_GUEST_KEEP:-} ]] || compgen -G "$SR_TOP/*/keep" >/dev/null; then
		return
	fi
	rm -rf "$SR_TOP"
}

# --- One guest for many commands: tests/softroce/cargo's session --------------
# The cargo wrapper exports VERBS_SHARED_GUEST=DIR (DIR/owner holds its pid).
# Each command `guest` gets then becomes a job of one long-lived guest
# running ./serve, booted by the first and powered off when the wrapper
# exits, instead of booting a guest of its own: a test suite pays one boot,
# not one per test binary. A job sees what a fresh guest's command sees (its
# cwd, arguments and environment, a fresh /tmp and /dev/shm, no process of
# an earlier job) and comes back the same way (stdout, stderr, status; 124
# at the time limit, 125 when the bed failed). A job that kills or wedges
# the guest fails alone: the next one boots a fresh guest, as it does after
# a job that changed the guest's network, RDMA ports or huge pages.

# sr_shared_alive RUN: the shared guest of RUN is still running.
sr_shared_alive() {
	[[ -s $1/qpid && ! -e $1/qemu.status ]] && kill -0 "$(cat "$1/qpid")" 2>/dev/null
}

# sr_shared_stop RUN: power the shared guest off (a throwaway: no shutdown
# to wait for) and wait until its qemu is gone (10 s at most).
sr_shared_stop() {
	local run=$1 i
	[[ -s $run/qpid ]] && kill "$(cat "$run/qpid")" 2>/dev/null
	for ((i = 0; i < 100; i++)); do
		[[ -e $run/qemu.status || ! -s $run/qpid ]] && break
		sleep 0.1
	done
}

# sr_shared_boot SESSION BINDS_FILE: boot the session's guest in the
# background (a new run directory, recorded in SESSION/current), with the
# host /tmp entries BINDS_FILE lists and the ones ./serve needs. The guest
# lives until its qemu is stopped or the session's owner is gone.
sr_shared_boot() {
	local s=$1 binds=$2 run
	run=$(mktemp -d "${TMPDIR:-/tmp}/softroce.XXXXXX") || sr_die "no temp dir"
	mkdir "$run/jobs"
	(cd / && sr_prepare "$run" bash "$SR_DIR/serve")
	sort -u "$binds" "$run/tmpbinds" -o "$run/tmpbinds"
	echo "$run" >"$s/current"
	(
		# No descriptor of the caller's lives on in the guest: not the
		# session's lock, which ends with this job, nor any lock or pipe
		# of whoever started cargo.
		for fd in /proc/$BASHPID/fd/*; do
			fd=${fd##*/}
			((fd > 2)) && eval "exec $fd>&-"
		done
		# qemu without a time limit of its own (each job has one), in this
		# process group: whatever stops the group stops the guest.
		sr_qemu "$run" 0 &
		q=$!
		echo "$q" >"$run/qpid"
		trap 'kill "$q"; wait "$q"; echo 143 >"$run/qemu.status"; exit' TERM INT HUP
		owner=$(cat "$s/owner")
		while kill -0 "$q" 2>/dev/null; do
			kill -0 "$owner" 2>/dev/null || { kill "$q"; break; }
			sleep 0.5
		done
		wait "$q"
		echo $? >"$run/qemu.status"
	) </dev/null >/dev/null 2>&1 &
	local i
	for ((i = 0; i < 100; i++)); do
		[[ -s $run/qpid ]] && break
		sleep 0.05
	done
	echo "$run"
}

# sr_shared_end SESSION: stop the session's guest and remove the session
# (the cargo wrapper's EXIT trap). A run kept for diagnosis stays.
sr_shared_end() {
	local s=$1 run=
	[[ -r $s/current ]] && read -r run <"$s/current"
	if [[ -n $run ]]; then
		sr_shared_stop "$run"
		[[ -n ${VERBS_GUEST_KEEP:-} || -e $run/keep ]] || rm -rf "$run"
	fi
	rm -rf "$s"
}

# sr_shared_run CMD...: CMD as a job of the session's guest (booting one if
# it has none, or none that can see CMD's host /tmp entries). Streams CMD's
# output and returns its status, as sr_boot does for a fresh guest. The
# caller holds SESSION/lock: one job at a time.
sr_shared_run() {
	local s=$VERBS_SHARED_GUEST limit=${VERBS_GUEST_TIMEOUT:-600} run= jd t0 booted= w ws status out err
	t0=$EPOCHREALTIME
	rm -rf "$s/next" && mkdir "$s/next" || sr_die "cannot write to $s"
	sr_prepare "$s/next" "$@"
	[[ -r $s/current ]] && read -r run <"$s/current"
	if [[ -n $run ]] && ! sr_shared_alive "$run"; then
		[[ -e $run/keep ]] || rm -rf "$run"
		run=
	fi
	if [[ -n $run && -n $(comm -23 "$s/next/tmpbinds" "$run/tmpbinds") ]]; then
		sr_shared_stop "$run"
		rm -rf "$run"
		run=
	fi
	if [[ -z $run ]]; then
		run=$(sr_shared_boot "$s" "$s/next/tmpbinds") && [[ -d $run/jobs ]] || sr_die "cannot start a shared guest"
		booted=1
	fi
	jd=$run/jobs/$(date +%s%N)
	mkdir "$run/jobs/.new" && cp "$s/next/job" "$s/next/tmpbinds" "$run/jobs/.new/" &&
		: >"$run/jobs/.new/stdout" && : >"$run/jobs/.new/stderr" && mv "$run/jobs/.new" "$jd" ||
		sr_die "cannot queue the job in $run"
	# shellcheck disable=SC2064 # expand now
	trap "sr_shared_stop '$run'; exit 143" TERM
	# shellcheck disable=SC2064
	trap "sr_shared_stop '$run'; exit 130" INT
	# The job ends with its status, its guest's end, or the time limit.
	(
		end=$((SECONDS + limit))
		until [[ -e $jd/status ]]; do
			sr_shared_alive "$run" || { sleep 0.3; [[ -e $jd/status ]] && exit 0; exit 1; }
			((SECONDS < end)) || exit 2
			sleep 0.2
		done
	) &
	w=$!
	sr_follow "$jd/stdout" "$w" &
	out=$!
	sr_follow "$jd/stderr" "$w" >&2 &
	err=$!
	wait "$w"
	ws=$?
	wait "$out" "$err"
	trap - TERM INT
	if ((ws == 0)); then
		read -r status <"$jd/status"
		if [[ -n ${VERBS_GUEST_TIMING:-} ]]; then
			sr_say "$(awk -v a="$t0" -v b="$(stat -c %.3Y "$jd/started")" -v c="$EPOCHREALTIME" -v how="${booted:+booted for it}" \
				'BEGIN { printf "queued-to-command %.2f s, whole job %.2f s (shared guest%s)", b - a, c - a, how ? ", " how : "" }')"
		fi
		if [[ -e $jd/tainted ]]; then
			sr_say "$* changed the guest; the next command gets a fresh one:"
			sed 's/^/  /' "$jd/tainted" >&2
			# It is shutting down; until its qemu is gone it still looks
			# alive, and the next job would be queued to it and lost.
			sr_shared_stop "$run"
		fi
		rm -rf "$jd"
		return "$status"
	fi
	if ((ws == 2)); then
		sr_shared_stop "$run"
		sr_say "time limit $limit s exceeded running $*"
		sr_say "last console lines of the shared guest ($run/console.log):"
	else
		sr_say "the shared guest died while running $* (or before it started)"
		sr_say "last console lines ($run/console.log):"
	fi
	tail -n 25 "$run/console.log" >&2 2>/dev/null
	: >"$run/keep"
	sr_say "kept $run"
	((ws == 2)) && return 124
	return 125
}
