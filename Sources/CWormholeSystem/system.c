#include "CWormholeSystem.h"

#if defined(__linux__)
#include <fcntl.h>
#include <linux/falloc.h>

int cwormhole_punch_hole(int fd, long long offset, long long length) {
    return fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, offset, length);
}
#endif
