#!/bin/bash
# Slurm Prolog: a slotscope recording of this job on this node, scoped to the job's cgroup and
# detached from slurmd; epilog.sh stops it and writes the job's report. Settings: common.sh.
#
# It returns at once: the recorder waits for the job's cgroup (slurmstepd makes it as the first
# step starts, after this script), then loads its probes, which takes seconds; a save in the
# job's first seconds is not in the capture.
. "$(dirname -- "$0")/common.sh"

# The job's cgroup v2 directory. Slurm's cgroup/v2 plugin makes it in slurmstepd.scope beside
# slurmd's own cgroup, in which this script runs (system.slice/slurmd.service ->
# system.slice/slurmstepd.scope/job_<id>); with PrologFlags=RunInJob this runs inside it.
job_cgroup() {
    local root own
    if [ -n "$JOB_CGROUP" ]; then
        echo "$JOB_CGROUP"
        return
    fi
    root=$(awk '$3 == "cgroup2" { print $2; exit }' /proc/self/mounts)
    own=$(sed -n 's/^0:://p' /proc/self/cgroup)
    [ -n "$root" ] && [ -n "$own" ] || return 1
    case $own in
        */job_"$SLURM_JOB_ID"/*) echo "$root${own%%/job_"$SLURM_JOB_ID"/*}/job_$SLURM_JOB_ID" ;;
        *) echo "$root${own%/*}/slurmstepd.scope/job_$SLURM_JOB_ID" ;;
    esac
}

# The detached recorder (prolog.sh --recorder CAPTURE CGROUP): wait for the cgroup, then
# become `slotscope record`, with the same pid. Without the job's cgroup it records the node's
# traced files (other users' too), and epilog.sh keeps that report root's.
recorder() {
    local cgroup=$1 waited=0
    if [ -n "$cgroup" ]; then
        while [ ! -d "$cgroup" ] && [ "$waited" -lt $((CGROUP_WAIT * 5)) ]; do
            sleep 0.2
            waited=$((waited + 1))
        done
        if [ -d "$cgroup" ]; then
            echo "$cgroup" > "$scoped"
            exec "$SLOTSCOPE" record --bpf -q -o "$capture" --cgroup "$cgroup" "${RECORD_ARGS[@]}"
        fi
    fi
    say "the job's cgroup (${cgroup:-no cgroup v2}) did not appear within $CGROUP_WAIT s: recording every" \
        "process's traced files; the report stays root's"
    exec "$SLOTSCOPE" record --bpf -q -o "$capture" "${RECORD_ARGS[@]}"
}

job_names || exit 0
if [ "${1:-}" = --recorder ]; then
    recorder "$3"
    exit 0
fi
if [ "${SLURM_SCRIPT_CONTEXT:-prolog_slurmd}" != prolog_slurmd ]; then
    say "run as $SLURM_SCRIPT_CONTEXT: prolog.sh is slurm.conf's Prolog"
    exit 0
fi
if [ ! -x "$SLOTSCOPE" ]; then
    say "no $SLOTSCOPE (SLOTSCOPE in slotscope-slurm.conf): not recorded"
    exit 0
fi
[ -d "$CAPTURES" ] || (umask 022 && mkdir -p -m 0711 -- "$CAPTURES")
[ -d "$STATE" ] || mkdir -p -m 0700 -- "$STATE"
for dir in "$CAPTURES" "$STATE"; do
    if ! root_only "$dir"; then
        say "$dir is not root's alone (or has a symbolic link in it): not recorded"
        exit 0
    fi
done
if pid=$(running_recorder); then
    say "already recorded by pid $pid"
    exit 0
fi
cgroup=$(job_cgroup) || cgroup=
setsid "$0" --recorder "$capture" "$cgroup" < /dev/null > "$log" 2>&1 &
pid=$!
echo "$pid" > "$pidfile"
# slurmd kills this script's process group once it exits: return when the recorder has left it.
for ((i = 0; i < 50; i++)); do
    [ "$(sed 's/.*) //' "/proc/$pid/stat" 2>/dev/null | cut -d' ' -f3)" != "$$" ] && break
    sleep 0.1
done
exit 0
