# Sourced by prolog.sh and epilog.sh: their settings, the job's names, the checks they share.
#
# Install the three files in one root-owned directory and name them in slurm.conf:
#   Prolog=/etc/slurm/slotscope/prolog.sh
#   Epilog=/etc/slurm/slotscope/epilog.sh
# Settings: the defaults below, overridden by slotscope-slurm.conf beside the scripts (a bash
# fragment, read only when root owns it and no one else may write it), e.g.
#   SLOTSCOPE=/opt/slotscope/bin/slotscope
#   RECORD_ARGS=(--path /mnt/ckpt --max-size 4G)
#
# slurmd runs these as root with its own environment (SLURM_JOB_ID, SLURM_JOB_UID,
# SLURM_JOB_USER, SLURMD_NODENAME, SLURM_SCRIPT_CONTEXT, ...), no PATH, in a process group that
# it kills once the script exits; a script that exits non-zero drains the node. So both
# always exit 0 and say what went wrong in the system log (tag slotscope-slurm).
PATH=/usr/sbin:/usr/bin:/sbin:/bin
umask 077

SLOTSCOPE=/usr/local/bin/slotscope      # the slotscope command (no PATH here)
CAPTURES=/var/lib/slotscope-jobs        # captures and reports; local disk, root's alone
STATE=/run/slotscope-jobs               # the recorders' pids and logs
RECORD_ARGS=(--max-size 2G)             # what record traces, besides the job's cgroup (default: NFS files)
JOB_CGROUP=                             # the job's cgroup v2 directory; empty: derived (prolog.sh's job_cgroup)
CGROUP_WAIT=60                          # s the recorder waits for the job's cgroup to appear
STOP_WAIT=30                            # s the epilog waits for the recorder to stop, then SIGKILL
ANALYZE_TIMEOUT=300                     # s the epilog gives the analysis
SHARE_REPORT=yes                        # the report readable by the job's user (when it holds only the job)

say() {
    logger -t slotscope-slurm -- "job ${SLURM_JOB_ID:-?}: $*" 2>/dev/null
    echo "slotscope-slurm: job ${SLURM_JOB_ID:-?}: $*" >&2
}

# A path root may write under, or read its settings from: no symbolic link in it, and it and
# every directory above it are root's and writable by root alone (above it, a sticky directory
# such as /tmp is fine), so no other user can swap a part of it for a link to elsewhere
# (capture/safepath.py's rule, for the shell).
root_only() {
    local path=$1 part=$1 uid mode
    [ "$(realpath -e -- "$path" 2>/dev/null)" = "$path" ] || return 1
    while :; do
        read -r uid mode < <(stat -c '%u %a' -- "$part") || return 1
        [ "$uid" = 0 ] || return 1
        if (( 8#$mode & 8#022 )) && { [ "$part" = "$path" ] || ! (( 8#$mode & 8#1000 )); }; then
            return 1
        fi
        [ "$part" = / ] && return 0
        part=$(dirname -- "$part")
    done
}

conf=$(realpath -e -- "$(dirname -- "$0")")/slotscope-slurm.conf
if [ -e "$conf" ]; then
    if root_only "$conf"; then
        # shellcheck source=/dev/null
        . "$conf"
    else
        say "$conf is not root's alone: ignored, defaults used"
    fi
fi

# The job's names: its id and node as slurmd gives them, checked, since they become paths.
job_names() {
    [[ ${SLURM_JOB_ID:-} =~ ^[0-9]+$ ]] || { say "no SLURM_JOB_ID: not run by slurmd?"; return 1; }
    local node=${SLURMD_NODENAME:-$(hostname -s)}
    [[ $node =~ ^[A-Za-z0-9._-]+$ ]] || node=node
    base=job-$SLURM_JOB_ID-$node
    [ "${SLURM_JOB_RESTART_COUNT:-0}" != 0 ] && [[ $SLURM_JOB_RESTART_COUNT =~ ^[0-9]+$ ]] \
        && base=$base-r$SLURM_JOB_RESTART_COUNT
    capture=$CAPTURES/$base                 # the capture (record: 0700, files 0600)
    report=$CAPTURES/$base.report           # report.txt, report.json, report.html
    pidfile=$STATE/$base.pid                # the recorder's pid
    scoped=$STATE/$base.cgroup              # the cgroup it records, when it found the job's
    log=$STATE/$base.log                    # its output
}

# The pid of this job's recorder while it runs (a zombie has stopped): the pidfile's, if that
# process's command line names the capture (a pid reused by another process does not).
running_recorder() {
    local pid state
    pid=$(cat -- "$pidfile" 2>/dev/null)
    [[ $pid =~ ^[0-9]+$ ]] || return 1
    state=$(sed 's/.*) //' "/proc/$pid/stat" 2>/dev/null) || return 1
    [ -n "$state" ] && [ "${state%% *}" != Z ] || return 1
    tr '\0' '\n' < "/proc/$pid/cmdline" 2>/dev/null | grep -qxF -- "$capture" || return 1
    echo "$pid"
}
