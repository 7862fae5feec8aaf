/* kvs_strerror: the texts of the one status table (kvshare_status.h). */
#include "kvshare.h"

const char *kvs_strerror(int status)
{
    switch (status) {
#define KVS_STATUS_TEXT(name, code, text)                                                          \
    case (code):                                                                                   \
        return (text);
        KVS_STATUS_TABLE(KVS_STATUS_TEXT)
#undef KVS_STATUS_TEXT
    default:
        return "unknown kvshare status";
    }
}
