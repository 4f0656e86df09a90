#!/usr/sbin/dtrace -s
/*
 * Latency histograms per collective and size, and bytes moved per peer, from
 * nuvec-distributed's USDT probes (build with `--features probes`). macOS:
 *
 *   sudo dtrace -s tools/trace/nuvec.d -p PID
 *   sudo dtrace -s tools/trace/nuvec.d -c 'path/to/binary args'
 *
 * (System Integrity Protection must allow dtrace.) Every second: bytes sent to and received
 * from each peer rank in that second; at exit (Ctrl-C), a power-of-two latency histogram
 * in microseconds per collective and size. The ring and JACCL fire the same probes (JACCL
 * has no send_step and recv_step).
 */

#pragma D option quiet

inline string opname[int op] =
    op == 0 ? "all_sum" : op == 1 ? "all_max" : op == 2 ? "all_min" :
    op == 3 ? "all_gather" : op == 4 ? "sum_scatter" : op == 5 ? "send" :
    op == 6 ? "recv" : op == 7 ? "barrier" : op == 8 ? "broadcast" :
    op == 9 ? "all_to_all" : "other";

dtrace:::BEGIN
{
    printf("tracing nuvec collectives; Ctrl-C prints latency histograms\n");
}

nuvec*:::collective_done
{
    /* arg0 op, arg2 bytes, arg4 duration in ns, arg5 1 if it succeeded */
    @latency_us[opname[arg0], arg2] = quantize(arg4 / 1000);
    @count[opname[arg0], arg2] = count();
}

nuvec*:::collective_done
/arg5 == 0/
{
    @failed[opname[arg0]] = count();
}

nuvec*:::send_step { @sent_to_rank[arg0] = sum(arg2); }
nuvec*:::recv_step { @received_from_rank[arg0] = sum(arg2); }

nuvec*:::connect_done
{
    printf("rank %d of %d formed its group (%d connection(s) per neighbour) in %d us, ok=%d\n",
        arg0, arg1, arg2, arg3 / 1000, arg4);
}

nuvec*:::error
{
    printf("group failed: peer %d, kind %d (1 io, 2 closed, 3 lost, 4 timeout, 5 auth, 6 protocol, 7 incompatible, 8 local, 9 rdma, 10 mismatch)\n",
        arg0, arg1);
}

tick-1sec
{
    printa("sent to rank %d: %@d bytes\n", @sent_to_rank);
    printa("received from rank %d: %@d bytes\n", @received_from_rank);
    trunc(@sent_to_rank);
    trunc(@received_from_rank);
}

dtrace:::END
{
    printa(@count);
    printa(@latency_us);
}
