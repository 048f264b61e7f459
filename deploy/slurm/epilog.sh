#!/bin/bash
# Slurm Epilog: stop this job's recording (prolog.sh started it), analyse it, and write its
# report beside the capture, CAPTURES/job-<id>-<node>.report/report.{txt,json,html}: readable
# by the job's user when the capture held the job's processes alone (its cgroup), else root's.
# Settings: common.sh.
. "$(dirname -- "$0")/common.sh"

job_names || exit 0
if [ "${SLURM_SCRIPT_CONTEXT:-epilog_slurmd}" != epilog_slurmd ]; then
    say "run as $SLURM_SCRIPT_CONTEXT: epilog.sh is slurm.conf's Epilog"
    exit 0
fi
# Nothing to do where the prolog started no recorder (it said why).
[ -f "$pidfile" ] || exit 0
for dir in "$CAPTURES" "$STATE"; do
    if ! root_only "$dir"; then
        say "$dir is not root's alone (or has a symbolic link in it): left as it is"
        exit 0
    fi
done

# SIGTERM: record stops cleanly, its capture whole; SIGKILL after STOP_WAIT costs the last second.
wait_stopped() {
    local i
    for ((i = 0; i < $1 * 5; i++)); do
        running_recorder > /dev/null || return 0
        sleep 0.2
    done
    return 1
}
if pid=$(running_recorder); then
    kill -TERM "$pid"
    if ! wait_stopped "$STOP_WAIT"; then
        say "the recorder (pid $pid) still ran $STOP_WAIT s after SIGTERM: killed"
        kill -KILL "$pid"
        wait_stopped 5
    fi
fi

if [ ! -f "$capture/meta.json" ]; then
    say "no capture: $(tail -n 3 -- "$log" 2>/dev/null | tr '\n' ' ')"
elif ! { mkdir -m 0700 -- "$report" 2>/dev/null || [ -d "$report" ]; } || ! root_only "$report"; then
    say "$report is not root's alone: no report"
elif ! timeout "$ANALYZE_TIMEOUT" "$SLOTSCOPE" analyze --report "$report" "$capture" > /dev/null 2>> "$log"; then
    say "no report: $(tail -n 1 -- "$log" 2>/dev/null)"
elif [ "$SHARE_REPORT" = yes ] && [ -s "$scoped" ] && [[ ${SLURM_JOB_UID:-} =~ ^[0-9]+$ ]] \
        && [ "$SLURM_JOB_UID" != 0 ]; then
    # The files become the user's (0400) in a directory that stays root's (0711): the user reads
    # them, and can neither list nor add to what is around them.
    files=("$report"/report.txt "$report"/report.json "$report"/report.html)
    chmod 0400 -- "${files[@]}" && chown -h -- "$SLURM_JOB_UID" "${files[@]}" && chmod 0711 -- "$report" \
        && say "report in $report, readable by ${SLURM_JOB_USER:-uid $SLURM_JOB_UID}"
else
    say "report in $report, root's (SHARE_REPORT=$SHARE_REPORT; the capture $( [ -s "$scoped" ] \
        && echo "held the job's cgroup" || echo "held every process's files"))"
fi
rm -f -- "$pidfile" "$scoped" "$log"
exit 0
