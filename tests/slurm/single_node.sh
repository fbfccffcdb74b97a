#!/usr/bin/env bash
# A one-node SLURM cluster on this machine, for trying profiles/slurm before a real cluster
# and for the test that runs the micro workflow through it (tests/test_slurm.py).
#
#   tests/slurm/single_node.sh start DIR   # writes DIR/slurm.conf, starts munged, slurmctld, slurmd
#   tests/slurm/single_node.sh stop DIR    # stops exactly the daemons `start` started (DIR/*.pid)
#
# Needs root and Debian's packages: apt-get install --no-install-recommends slurmctld slurmd
# slurm-client munge (Slurm 22.05 on Debian 12). No systemd, no cgroups, no accounting database:
# - everything lives in DIR (munge's key and socket, Slurm's state, spool, logs and pid files)
#   except one link: /etc/slurm/slurm.conf -> DIR/slurm.conf. SLURM_CONF is not enough, since
#   the executor plugin's job step drops every SLURM_* variable before its srun, which then
#   looks for the default path. `start` refuses to replace a slurm.conf it did not write or a link
#   to a cluster whose daemons still run, replaces a link whose cluster's daemons are gone (a run
#   killed before its `stop`), and `stop` removes the link;
# - proctrack/linuxproc and task/none track jobs without cgroups;
# - no slurmdbd, so `sacct` answers nothing: the executor plugin must query with
#   `--slurm-status-command squeue`, which sees a finished job for MinJobAge seconds (set high);
# - DefMemPerCPU: without it a job is given the whole node's memory and jobs run one at a time.
set -euo pipefail

usage() { echo "usage: $0 start|stop DIR" >&2; exit 2; }
[ $# -eq 2 ] || usage
cmd=$1
ETC_CONF=/etc/slurm/slurm.conf
dir=$(mkdir -p "$2" && cd "$2" && pwd)

# the names and pids of DIR's daemons that still run (their pid files lie in DIR)
running_daemons() {
    local name pid
    for name in slurmd slurmctld munged; do
        [ -f "$1/$name.pid" ] || continue
        pid=$(cat "$1/$name.pid")
        [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$name" ] && echo -n "$name $pid; "
    done
    return 0
}

# /etc/slurm/slurm.conf is free for DIR: absent, already DIR's, or a link left by a cluster of this
# script whose daemons are gone (a run killed before its `stop`), which is removed. A link to a
# cluster that still runs, or a file this script did not write, is left alone and `start` refuses,
# before it starts any daemon.
claim_conf_link() {
    [ -e "$ETC_CONF" ] || [ -L "$ETC_CONF" ] || return 0
    local target other running
    target=$(readlink "$ETC_CONF" || true)
    [ "$target" = "$dir/slurm.conf" ] && return 0
    if [ -z "$target" ] || { [ -e "$target" ] && ! grep -qx 'ClusterName=single-node' "$target"; }; then
        echo "$ETC_CONF exists and is not this script's: not replacing it" >&2
        exit 1
    fi
    other=$(dirname "$target")
    running=$(running_daemons "$other")
    if [ -n "$running" ]; then
        echo "another single-node cluster runs from $other (${running%; }): $0 stop $other" >&2
        exit 1
    fi
    echo "$ETC_CONF -> $target was left by a cluster whose daemons are gone: replacing it" >&2
    rm -f "$ETC_CONF"
}

# the last lines of each daemon's log, for a cluster that did not come up
show_logs() {
    local log
    for log in munged slurmctld slurmd; do
        [ -f "$dir/$log.log" ] || continue
        echo "--- $dir/$log.log (last 20 lines)" >&2
        tail -n 20 "$dir/$log.log" >&2
    done
}

start() {
    for exe in munged slurmctld slurmd sinfo; do
        command -v "$exe" >/dev/null || {
            echo "$exe not found: apt-get install --no-install-recommends slurmctld slurmd slurm-client munge" >&2
            exit 1
        }
    done
    [ "$(id -u)" = 0 ] || { echo "the daemons run as root here: run $0 as root" >&2; exit 1; }
    local host cpus mem_mb
    host=$(hostname -s)
    getent hosts "$host" >/dev/null || { echo "hostname $host does not resolve: add it to /etc/hosts" >&2; exit 1; }
    claim_conf_link
    cpus=$(nproc)
    # the node offers a bit less than the machine's memory, leaving room for the daemons and the login
    mem_mb=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 * 9 / 10 ))
    chmod 700 "$dir"
    mkdir -p "$dir/munge" "$dir/state" "$dir/spool"
    chmod 700 "$dir/munge"
    [ -f "$dir/munge/munge.key" ] || { head -c 1024 /dev/urandom > "$dir/munge/munge.key"; chmod 400 "$dir/munge/munge.key"; }
    munged --force --socket="$dir/munge/munge.socket" --key-file="$dir/munge/munge.key" \
        --pid-file="$dir/munged.pid" --log-file="$dir/munged.log" --seed-file="$dir/munge/munged.seed"
    cat > "$dir/slurm.conf" <<CONF
ClusterName=single-node
SlurmctldHost=$host
SlurmUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.socket
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
SlurmctldPort=6817
SlurmdPort=6818
ReturnToService=2
MinJobAge=3600
DefMemPerCPU=$(( mem_mb / cpus ))
NodeName=$host CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN
PartitionName=main Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF
    if [ ! -e "$ETC_CONF" ] && [ ! -L "$ETC_CONF" ]; then
        mkdir -p "$(dirname "$ETC_CONF")"
        ln -s "$dir/slurm.conf" "$ETC_CONF"
    fi
    slurmctld -f "$dir/slurm.conf" || { echo "slurmctld did not start" >&2; show_logs; exit 1; }
    slurmd -f "$dir/slurm.conf" || { echo "slurmd did not start" >&2; show_logs; exit 1; }
    # the node reports idle within a few seconds
    for _ in $(seq 60); do
        if sinfo -h -o %T 2>/dev/null | grep -qx idle; then
            echo "single-node SLURM up: $(sinfo -h -o '%n, %c CPUs, %m MB'), config $ETC_CONF -> $dir/slurm.conf"
            return 0
        fi
        sleep 0.5
    done
    echo "the node did not come up within 30 s; logs in $dir" >&2
    sinfo >&2 || true
    show_logs
    exit 1
}

stop() {
    local name pid
    for name in slurmd slurmctld munged; do
        [ -f "$dir/$name.pid" ] || continue
        pid=$(cat "$dir/$name.pid")
        if kill "$pid" 2>/dev/null; then
            for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
            kill -0 "$pid" 2>/dev/null && kill -9 "$pid" 2>/dev/null || true
        fi
        rm -f "$dir/$name.pid"
    done
    if [ "$(readlink "$ETC_CONF" || true)" = "$dir/slurm.conf" ]; then rm -f "$ETC_CONF"; fi
}

case $cmd in
    start) start ;;
    stop) stop ;;
    *) usage ;;
esac
