"""The named scenarios: `run-scenario` options of the VM tier's session fixtures
(tests/vm/conftest.py) and of bench/overhead.py. Each is meant to show one thing
clearly in a few seconds of writers. Those on one kernel and clock share a boot, in this
order (tests/vm/README.md, "The plan"): mixed's 2-slot table comes before
unconstrained's unlimited one (tests/vm/test_shared_boot.py checks the reset between
them), and frozen, whose server goes away for a while, comes last."""

# Guest time counts emulated instructions (one vCPU, 1 ns each), so a timing a test asserts
# does not follow the host's speed and load; the export is a tmpfs because host disk I/O is
# not on that clock (vmrig/vm.py icount_args). The probe scenarios each kernel runs (mixed,
# saturated, saturated_v42, unconstrained, frozen) are all on it, so that a kernel costs one
# boot (tests/vm/README.md, "The plan"); an idle guest's waits (frozen's 25 s) pass at once.
# BCC's compile reads thousands of headers from the virtio disk, each wait a jump of the guest's
# clock: on a loaded host it can take more guest time than the default 240 s.
INSTRUCTION_CLOCK = ("--icount", "0", "--export-fs", "tmpfs", "--agent-start-timeout", "900")

# A real job (guest/clients.py): 2 ranks under torchrun save 2 MiB each with torch.save, DCP,
# DCP's async_save and safetensors in turn, 12 s of computing apart: more than the analyzer's
# save_gap_s (10 s), so that each library's save is a save of its own. Two ranks, not four: most
# of a job's time under TCG is its ranks importing torch (README.md, "The plan").
CLIENTS = ("--ranks", "2", "--state-mb", "2", "--save-every", "12", "--client", "torch-save", "--client", "dcp",
           "--client", "dcp-async", "--client", "safetensors")

# 8 ranks of 4 KiB O_SYNC writes over a 20 ms round trip: the saturating storm.
SMALL_SYNC = ("--ranks", "8", "--write-size", "4096", "--mode", "osync", "--file-mb", "0.25")
STORM = ("--delay-ms", "10", *SMALL_SYNC)
# The what-if pairs whose change must buy little (issue 23), with 2 slots before, 16 after:
# the small writes with the server next door (1 ms round trip), whose one thread syncs each
# WRITE to an export whose every I/O takes 5 ms: the server is the limit. Rank 0 saves twice
# what the others do: its last 64 writes go alone, and the capture sees the server's time
# with 1 in flight as well as 2 (with the slots always full, 9 of 512 sendings saw 1, each
# beside a metadata call the one thread serves too, and the model fitted half the server's
# growth). A fast export never bound one thread: 4 KiB O_SYNC writes went 6.2 -> 1.9 s with
# 16 slots over 20 ms, 1 MiB ones 0.27 -> 0.17 s over 1 ms on a tmpfs.
SERVER_BOUND = ("--delay-ms", "0.5", *SMALL_SYNC, "--nfsd-threads", "1", "--export-fs", "slowdisk",
                "--disk-ms", "5", "--rank-override", "0:file-mb=0.5")
# 4 ranks of 1 MiB O_SYNC writes over a link held to 20 Mbit/s: the link is the limit.
LINK_BOUND = ("--ranks", "4", "--write-size", "1048576", "--mode", "osync", "--file-mb", "4", "--delay-ms", "5",
              "--rate-mbit", "20")

NAMED = {
    # fsync'ed 64 KiB writes (WRITE + COMMIT), one rank of 4 KiB O_SYNC writes, plus the
    # LOOKUP/CREATE/ACCESS/GETATTR of creating the files; a 2-slot table makes waits real.
    "mixed": ["--nfs-vers", "3", "--slots", "2", "--delay-ms", "5", "--ranks", "4", "--write-size", "65536",
              "--mode", "fsync", "--file-mb", "1", "--rank-override", "1:write-size=4096,mode=osync",
              *INSTRUCTION_CLOCK],
    # NFSv3 transport slot table of 4, 8 ranks of 4 KiB O_SYNC writes, 20 ms RTT:
    # WRITEs queue on xprt_backlog.
    # On the instruction clock: slot wait's share is set by the ranks' CPU time between writes
    # against the round trip, which on the wall clock follows TCG's speed.
    "saturated": ["--nfs-vers", "3", "--slots", "4", *STORM, *INSTRUCTION_CLOCK],
    # The same storm on NFSv4.2 with 4 session slots (nfs.max_session_slots): the wait
    # moves to the session's "ForeChannel Slot table"; the transport has slots to spare.
    # ftrace of nfs4_sequence_done gives the kernel's own slot number of every SEQUENCE
    # and the server's highest/target slot ids.
    "saturated_v42": ["--nfs-vers", "4.2", "--slots", "4", *STORM, "--ftrace", "nfs4:nfs4_sequence_done",
                      *INSTRUCTION_CLOCK],
    # Healthy: 1 MiB buffered writes, no slot limit; a tiny dirty_background_bytes makes
    # the flusher kworker write back while the ranks are still writing.
    "unconstrained": ["--nfs-vers", "3", "--ranks", "4", "--write-size", "1048576", "--mode", "buffered",
                      "--file-mb", "4", "--dirty-background-bytes", "65536", *INSTRUCTION_CLOCK],
    # Many small FILE_SYNC WRITEs (4 KiB O_SYNC, 8 ranks, 10 ms RTT) and no slot limit:
    # the dynamic slot table grows, nothing queues for a slot; each write waits a round
    # trip. Also the workload of bench/overhead.py.
    "small_sync": ["--nfs-vers", "3", "--delay-ms", "5", "--ranks", "8", "--write-size", "4096",
                   "--mode", "osync", "--file-mb", "0.25"],
    # 1 MiB buffered writes land in the page cache at once; the flush at fsync() pushes
    # them through a slow link (20 Mbit/s, 40 ms RTT, 64 KiB WRITEs): the ranks spend
    # their save in fsync. No slot limit: the table grows, nothing queues for a slot.
    "flush_stall": ["--nfs-vers", "3", "--delay-ms", "20", "--rate-mbit", "20", "--wsize", "65536",
                    "--ranks", "4", "--write-size", "1048576", "--mode", "fsync", "--file-mb", "4"],
    # The saturating storm over nconnect=2 with 2 slots per connection: each connection
    # (struct rpc_xprt) has its own table of 2, and WRITEs queue on both.
    "nconnect": ["--nfs-vers", "3", "--slots", "2", "--nconnect", "2", "--delay-ms", "10", "--ranks", "8",
                 "--write-size", "4096", "--mode", "osync", "--file-mb", "0.25"],
    # 4 ranks of O_SYNC 1 MiB writes, 1 MiB each, except rank 2 with 16 MiB, over a 40 Mbit/s
    # link (so that times are seconds, not tens of ms): each rank has one write in flight, so
    # the others end within the first 4 MiB (0.7-0.9 s) and rank 2 6x later (4.4 s). No slot limit.
    # Not buffered: the others' flushes at close() queued behind as much of rank 2's writeback
    # as the ranks' timing let in, ending 0.5-2.4 s in (ratio 2.4x-4x, even on this clock).
    # On the instruction clock: on the wall clock TCG's speed moved the ratio from 3.8x down
    # to 2.1x, across the 2.5x the test asserts.
    "straggler": ["--nfs-vers", "3", "--delay-ms", "5", "--rate-mbit", "40", "--ranks", "4",
                  "--write-size", "1048576", "--mode", "osync", "--file-mb", "1",
                  "--rank-override", "2:file-mb=16", *INSTRUCTION_CLOCK],
    # What-if pairs (test_whatif_pairs.py, issue 23): the two saturated storms above, each the BEFORE
    # of a change whose AFTER is one of these; the prediction is made from BEFORE alone.
    # 4 -> 16 transport slots: the limit becomes the ranks, one write in flight each.
    "slots16": ["--nfs-vers", "3", "--slots", "16", *STORM, *INSTRUCTION_CLOCK],
    # the ranks save to a local tmpfs, then copy to NFS in 1 MiB buffered writes
    "local_copy": ["--nfs-vers", "3", "--slots", "4", *STORM, "--local-then-copy", *INSTRUCTION_CLOCK],
    # NFSv4.2 with 4 session slots -> 32
    "session32": ["--nfs-vers", "4.2", "--slots", "32", *STORM, *INSTRUCTION_CLOCK],
    # ... and nconnect 4 instead: the session's table is shared by the connections, so it buys little
    "v42_nconnect4": ["--nfs-vers", "4.2", "--slots", "4", "--nconnect", "4", *STORM, *INSTRUCTION_CLOCK],
    # the link-bound pair, and the server-bound one (its slow export makes a boot of its own)
    "link_bound": ["--nfs-vers", "3", "--slots", "2", *LINK_BOUND, *INSTRUCTION_CLOCK],
    "link_bound16": ["--nfs-vers", "3", "--slots", "16", *LINK_BOUND, *INSTRUCTION_CLOCK],
    "server_bound": ["--nfs-vers", "3", "--slots", "2", *INSTRUCTION_CLOCK, *SERVER_BOUND],
    "server_bound16": ["--nfs-vers", "3", "--slots", "16", *INSTRUCTION_CLOCK, *SERVER_BOUND],
    # The real clients on a healthy mount: no slot limit, 10 ms round trip.
    "clients_healthy": ["--nfs-vers", "3", "--delay-ms", "5", *CLIENTS],
    # ... and on a saturating one: 2 slots of 32 KiB WRITEs per 20 ms round trip, a ceiling of
    # 2 x 32 KiB / 20 ms = 3.2 MB/s, well under what the emulated CPU writes (the test checks).
    "clients_saturated": ["--nfs-vers", "3", "--slots", "2", "--wsize", "32768", "--delay-ms", "10", *CLIENTS],
    # One torchrun job over two nodes (a pair of VMs of its own; guest/clients.py): ranks 0-1 on
    # node 1 (the server's VM), 2-3 on node 2 (static rendezvous), gloo across the link. Each rank
    # saves 1 MiB with torch.save, then with DCP 12 s later (more than save_gap_s). Node 2's link
    # is held to 1.5 Mbit/s: its 2 MiB a save take 11 s or more; torch.save's ranks end on their
    # own, node 1's in 1-3.4 s (four ranks a node: 3.4 s on a host at load 6, when node 2's were
    # 2.9x later at 5 Mbit/s, against straggler_node's 2x). DCP's collective save ends on every
    # rank at once, so no node can be named late in it. ftrace of svc_process on the server gives
    # the server's receipt of each of node 2's RPCs, which bounds the clocks' offset
    # (test_two_nodes.py). Without --client the pair runs the rig's writers (by hand: a kernel
    # whose image has no torch).
    "two_nodes": ["--nodes", "2", "--node-rate-mbit", "2:1.5", "--nfs-vers", "4.2", "--ranks", "4",
                  "--state-mb", "1", "--save-every", "12", "--client", "torch-save", "--client", "dcp",
                  "--ftrace", "sunrpc:svc_process",
                  "--agent-start-timeout", "600"],     # two BCC compiles at once: 115-121 s on an idle host, > 240 s on a busy one
    # `slotscope watch` (issue 24; test_watch_vm.py), a boot of its own: a saturating storm, then a
    # healthy save. The storm: ranks 0-7, 4 KiB O_SYNC writes on 2 slots over a 20 ms round trip
    # (make-sample's storm), 256 KiB each; its slot table stays full for seconds (tasks wait on
    # xprt_backlog throughout but at its start and end), so slot_full_s=1 fires within it.
    # --after 30 keeps the storm's rest in the incident: it took 7 s on a quiet host, 13 s (past
    # an --after 12) at load 3. The healthy save: rank 8, 16 MiB in 256 KiB
    # O_SYNC writes (one WRITE each, one in flight: nothing waits for a slot), 11 s (more than
    # save_gap_s) after the storm ended and watch has written and analysed its incident; --rearm 2
    # has slot_full_s armed again by then, so a saturated second save would make a second incident.
    # On the wall clock: Prometheus on the host scrapes the metrics on the host's clock, and on the
    # instruction clock an idle guest's seconds pass in no host time (the quiet gap between the
    # saves, which the test finds in the scrapes, would not be scraped at all).
    "watched": ["--nfs-vers", "3", "--slots", "2", "--delay-ms", "10", "--ranks", "9", "--write-size", "4096",
                "--mode", "osync", "--file-mb", "0.25", "--rank-override", "8:write-size=262144,file-mb=16,after-s=11",
                "--watch", "--agent-args", "--trigger slot_full_s=1 --after 30 --rearm 2"],
    # 4 KiB O_SYNC writes; the server drops all traffic for 25 s after 1 s. A short
    # timeo makes the client log "not responding" (and "OK") within the freeze.
    "frozen": ["--nfs-vers", "3", "--ranks", "2", "--write-size", "4096", "--mode", "osync", "--file-mb", "0.5",
               "--delay-ms", "10", "--timeo", "20", "--retrans", "1",
               "--server-freeze-at", "1", "--server-freeze-for", "25", *INSTRUCTION_CLOCK],
}

# An ordinary user's agent (issue 22): the agent and ranks as uid 1000; the agent, refused
# BPF, samples /proc and mountstats (test_no_root.py compares its verdicts with the BPF agent's).
for _base in ("saturated", "flush_stall", "unconstrained", "frozen"):       # frozen last, as above
    NAMED[f"{_base}_sampled"] = [*NAMED[_base], "--agent-user", "slot"]
