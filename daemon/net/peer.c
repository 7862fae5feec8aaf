/* SPDX-License-Identifier: Apache-2.0 */
#include "peer.h"

#include <stdio.h>
#include <sys/socket.h>

#include "dispatch.h"
#include "kvshare_status.h"
#include "log.h"

void peer_identify(session_t *s)
{
    int fd = -1;
    struct ucred cred;
    socklen_t len = sizeof(cred);
    if (!s->sock.has_pipe || uv_fileno((uv_handle_t *)&s->sock.pipe, &fd) != 0)
        return;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || len != sizeof(cred))
        return;
    s->peer.known = true;
    s->peer.uid = (uint32_t)cred.uid;
    s->peer.gid = (uint32_t)cred.gid;
    s->peer.pid = (int32_t)cred.pid;
}

int peer_admit(session_t *s)
{
    server_t *srv = s->srv;
    const config_acl_t *acl = &srv->cfg.allow;
    if (acl->n_uids == 0 && acl->n_gids == 0) {
        LOG_INFO("session %llu: connected: pid %d, uid %u, gid %u", (unsigned long long)s->id,
                 (int)s->peer.pid, s->peer.uid, s->peer.gid);
        return 0;
    }
    if (s->peer.known && config_acl_allows(acl, s->peer.uid, s->peer.gid)) {
        LOG_INFO("session %llu: connected: pid %d, uid %u, gid %u (allowed)",
                 (unsigned long long)s->id, (int)s->peer.pid, s->peer.uid, s->peer.gid);
        return 0;
    }
    char allowed[256], msg[400];
    config_acl_describe(acl, allowed, sizeof(allowed));
    srv->metrics.peers_denied++;
    LOG_WARN("session %llu: refused pid %d, uid %u, gid %u: not in the allow-lists (%s)",
             (unsigned long long)s->id, (int)s->peer.pid, s->peer.uid, s->peer.gid, allowed);
    snprintf(msg, sizeof(msg),
             "permission denied: uid %u / gid %u may not use this kvshared (allow_uids / "
             "allow_gids in its config); ask its operator",
             s->peer.uid, s->peer.gid);
    dispatch_error_reply(s, 0, KVS_EDENIED, msg);
    return KVS_EDENIED;
}
