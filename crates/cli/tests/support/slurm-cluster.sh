#!/usr/bin/env bash
# A private two-node Slurm cluster (nodes n1, n2: two slurmd on this host, NodeAddr=127.0.0.1)
# for the Slurm launcher tests, all state under DIR; needs root, slurm-wlm and munge.
#   cluster.sh start DIR   -> prints "export SLURM_CONF=DIR/slurm.conf"
#   cluster.sh stop DIR    -> kills everything it started
set -euo pipefail

die() { echo "slurm-cluster.sh: $*" >&2; exit 1; }

usage() { die "usage: $0 {start|stop} DIR"; }

[ $# -eq 2 ] || usage
CMD=$1
DIR=$(realpath -m -- "$2")
CONF=$DIR/slurm.conf
NODES=(n1 n2)

# ---------------------------------------------------------------- helpers
pid_alive() { [ -n "${1:-}" ] && kill -0 "$1" 2>/dev/null; }

# alive and not a zombie
running() {
    local st
    st=$(cut -d' ' -f3 "/proc/$1/stat" 2>/dev/null) || return 1
    [ -n "$st" ] && [ "$st" != Z ] && [ "$st" != X ]
}

read_pid() { [ -s "$1" ] && tr -dc '0-9' <"$1" || true; }

port_free() {
    # free if nothing listens on it (TCP) and it is not in use as a local port
    [ -z "$(ss -Htan "( sport = :$1 )" 2>/dev/null)" ]
}

# Ports come from below the kernel's ephemeral range (ip_local_port_range): a port
# picked inside it can be taken by any outgoing connection on the host between the
# check and the daemon's bind, and a slurmd that cannot bind leaves its node "unk*".
declare -A USED_PORTS=()
pick_port() {
    local p i low span
    low=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
    [ "$low" -gt 12000 ] || die "ephemeral ports start at $low; no room below them for the daemons"
    span=$(( low - 10000 ))
    for i in $(seq 1 500); do
        p=$(( 10000 + (RANDOM * 32768 + RANDOM) % span ))
        [ -n "${USED_PORTS[$p]:-}" ] && continue
        if port_free "$p"; then USED_PORTS[$p]=1; echo "$p"; return 0; fi
    done
    die "no free port found"
}

# wait (max ~2 s) until none of the given pids is alive
wait_gone() {
    local i p any
    for i in $(seq 1 40); do
        any=
        for p in "$@"; do running "$p" && { any=1; break; }; done
        [ -z "$any" ] && return 0
        sleep 0.05
    done
    return 0
}

# pids of processes that hold a file open under $DIR: munged, slurmctld,
# slurmscriptd, slurmd and every slurmstepd (stepds keep the slurmd log open)
pids_using_dir() {
    find /proc/[0-9]*/fd -maxdepth 1 -lname "$DIR/*" 2>/dev/null |
        cut -d/ -f3 | sort -un | grep -vx "$$" || true
}

# Slurm client processes (srun, salloc, ...) using this cluster's slurm.conf
# through their environment; never our own ancestors.
client_pids() {
    local anc=" " p=$$ c e
    while [ -n "$p" ] && [ "$p" != 0 ]; do
        anc+="$p "
        p=$(cut -d' ' -f4 "/proc/$p/stat" 2>/dev/null || true)
    done
    for e in /proc/[0-9]*/environ; do
        p=${e#/proc/}; p=${p%/environ}
        case $anc in *" $p "*) continue ;; esac
        c=$(cat "/proc/$p/comm" 2>/dev/null) || continue
        case $c in
            srun|salloc|sbatch|sattach|scontrol|squeue|sinfo|scancel|sstat) ;;
            *) continue ;;
        esac
        running "$p" || continue
        { tr '\0' '\n' < "$e"; } 2>/dev/null | grep -qxF "SLURM_CONF=$CONF" && echo "$p"
    done
    return 0
}

# all descendants of the given pids (not the pids themselves)
descendants() {
    local -A kids=()
    local pid ppid
    while read -r pid ppid; do
        kids[$ppid]+=" $pid"
    done < <(ps -e -o pid=,ppid=)
    local queue=("$@") out=() p c
    while [ ${#queue[@]} -gt 0 ]; do
        p=${queue[0]}; queue=("${queue[@]:1}")
        for c in ${kids[$p]:-}; do out+=("$c"); queue+=("$c"); done
    done
    echo "${out[@]:-}"
}

# ---------------------------------------------------------------- stop
# Everything is SIGKILLed: the cluster is throw-away (start uses slurmctld -c).
do_stop() {
    [ -d "$DIR" ] || return 0
    local round pids stepds others p kids all=()
    for round in 1 2 3 4 5; do
        # daemons from pid files, plus whatever still has files open in DIR
        pids=$( { for f in "$DIR"/munged.pid "$DIR"/slurmctld.pid "$DIR"/slurmd-*.pid; do
                    [ -f "$f" ] && read_pid "$f" && echo; done
                  pids_using_dir; client_pids; } | grep -E '^[0-9]+$' | sort -un || true)
        pids=$(for p in $pids; do running "$p" && echo "$p"; done || true)
        [ -z "$pids" ] && break
        stepds=(); others=()
        for p in $pids; do
            if [ "$(cat /proc/$p/comm 2>/dev/null)" = slurmstepd ]; then stepds+=("$p"); else others+=("$p"); fi
        done
        # freeze the daemons and stepds so that nothing new is spawned, then
        # kill the tasks (descendants of the stepds), then everything else
        kill -STOP "${stepds[@]}" "${others[@]}" 2>/dev/null || true
        kids=$(descendants "${stepds[@]}" "${others[@]}")
        # shellcheck disable=SC2086
        [ -n "$kids" ] && { kill -KILL $kids 2>/dev/null || true; }
        kill -KILL "${stepds[@]}" "${others[@]}" 2>/dev/null || true
        # shellcheck disable=SC2206
        all+=(${stepds[@]} ${others[@]} $kids)
        # shellcheck disable=SC2086
        wait_gone $kids "${stepds[@]}" "${others[@]}"
    done
    # The killed daemons were re-parented to PID 1; give it a moment to reap
    # them so that "pgrep slurm" right after stop shows nothing (max 5 s).
    for _ in $(seq 1 100); do
        local left=
        for p in "${all[@]}"; do [ -e "/proc/$p" ] && { left=1; break; }; done
        [ -z "$left" ] && break
        sleep 0.05
    done
    rm -f "$DIR"/slurmd-*.pid "$DIR/slurmctld.pid" "$DIR/munged.pid" \
          "$DIR/munge.sock" "$DIR/munge.sock.lock"
}

# ---------------------------------------------------------------- start
do_start() {
    mkdir -p "$DIR"
    # refuse to start twice on the same dir
    if pid_alive "$(read_pid "$DIR/slurmctld.pid")" || pid_alive "$(read_pid "$DIR/munged.pid")"; then
        die "a cluster already runs in $DIR (use: $0 stop $DIR)"
    fi
    # from here on, a failure tears down whatever was started
    trap 'rc=$?; if [ $rc -ne 0 ]; then trap - EXIT; do_stop; fi; exit $rc' EXIT
    chmod 0755 "$DIR"
    mkdir -p "$DIR/state" "$DIR/log" "$DIR/tmp"
    for n in "${NODES[@]}"; do mkdir -p "$DIR/spool/$n"; done
    chmod 0755 "$DIR/state" "$DIR/log" "$DIR/spool" "$DIR"/spool/*
    chmod 1777 "$DIR/tmp"

    # ---- munge
    local key=$DIR/munge.key sock=$DIR/munge.sock
    if [ ! -s "$key" ]; then
        rm -f "$key"
        mungekey -c -k "$key" 2>/dev/null ||
            dd if=/dev/urandom of="$key" bs=1 count=1024 status=none
    fi
    chown "$(id -u):$(id -g)" "$key"
    chmod 0400 "$key"
    rm -f "$sock" "$sock.lock"
    munged --force \
        --socket="$sock" \
        --key-file="$key" \
        --pid-file="$DIR/munged.pid" \
        --log-file="$DIR/log/munged.log" \
        --seed-file="$DIR/munged.seed" \
        || die "munged failed, see $DIR/log/munged.log"
    for _ in $(seq 1 50); do [ -S "$sock" ] && break; sleep 0.1; done
    [ -S "$sock" ] || die "munged socket $sock did not appear"
    munge -n -S "$sock" | unmunge -S "$sock" >/dev/null || die "munge self-test failed"

    # ---- slurm.conf
    local host ctlport p1 p2 cpus=${CLUSTER_CPUS:-64}
    host=$(hostname)
    ctlport=$(pick_port); p1=$(pick_port); p2=$(pick_port)
    echo -n > "$DIR/plugstack.conf"
    cat > "$CONF" <<EOF
# generated by slurm-cluster.sh
ClusterName=ferromq-test
SlurmctldHost=localhost
SlurmctldPort=$ctlport
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$sock
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/pgid
TaskPlugin=task/none
SwitchType=switch/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
PlugStackConfig=$DIR/plugstack.conf
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
ReturnToService=2
SlurmdParameters=config_overrides
MaxTasksPerNode=${CLUSTER_MAX_TASKS_PER_NODE:-4096}
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
TmpFS=$DIR/tmp
MailProg=/bin/true
InactiveLimit=0
KillWait=5
MinJobAge=60
MessageTimeout=10
SlurmctldTimeout=30
SlurmdTimeout=60
Waittime=0
NodeName=n1 NodeAddr=127.0.0.1 NodeHostname=$host Port=$p1 CPUs=$cpus State=UNKNOWN
NodeName=n2 NodeAddr=127.0.0.1 NodeHostname=$host Port=$p2 CPUs=$cpus State=UNKNOWN
PartitionName=main Nodes=n1,n2 Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF

    # ---- daemons
    export SLURM_CONF=$CONF
    slurmctld -f "$CONF" -c -i || die "slurmctld failed, see $DIR/log/slurmctld.log"
    for n in "${NODES[@]}"; do
        slurmd -N "$n" -f "$CONF" || die "slurmd $n failed, see $DIR/log/slurmd-$n.log"
    done

    # ---- wait for both nodes idle
    local out=
    for _ in $(seq 1 300); do
        out=$(sinfo -h -N -o '%N %t' 2>/dev/null | sort -u || true)
        if [ "$(printf '%s\n' "$out" | grep -cE '^n[12] idle$')" = 2 ]; then
            trap - EXIT
            echo "export SLURM_CONF=$CONF"
            return 0
        fi
        sleep 0.1
    done
    echo "slurm-cluster.sh: nodes not idle after 30 s; sinfo says:" >&2
    printf '%s\n' "$out" >&2
    # the logs go with DIR when the caller cleans up: show their ends here
    local log
    for log in "$DIR"/log/slurmctld.log "$DIR"/log/slurmd-*.log; do
        [ -f "$log" ] || continue
        echo "--- last lines of $log:" >&2
        tail -n 15 "$log" >&2
    done
    exit 1
}

case $CMD in
    start) do_start ;;
    stop)  do_stop ;;
    *)     usage ;;
esac
