#include "metrics.h"

void metrics_count_rpc(metrics_t *m, unsigned rpc, int status)
{
    m->requests++;
    if (status != 0)
        m->errors++;
    if (rpc < METRICS_MAX_RPC) {
        m->rpc_calls[rpc]++;
        if (status != 0)
            m->rpc_errors[rpc]++;
    }
}
