#include "CWormholeSystem.h"
#include <string.h>

static uint32_t table[256];
static int table_ready;

static void make_table(void) {
    for (uint32_t index = 0; index < 256; index++) {
        uint32_t crc = index;
        for (int bit = 0; bit < 8; bit++) crc = (crc & 1) ? (crc >> 1) ^ 0x82F63B78u : crc >> 1;
        table[index] = crc;
    }
    table_ready = 1;
}

static uint32_t crc32c_table(uint32_t crc, const uint8_t *bytes, size_t length) {
    if (!table_ready) make_table();  // a benign race: every thread writes the same values
    crc = ~crc;
    while (length--) crc = table[(crc ^ *bytes++) & 0xFF] ^ (crc >> 8);
    return ~crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2")))
static uint32_t crc32c_sse42(uint32_t crc, const uint8_t *bytes, size_t length) {
    uint64_t value = ~crc;
    while (length >= 8) {
        uint64_t word;
        memcpy(&word, bytes, 8);
        value = __builtin_ia32_crc32di(value, word);
        bytes += 8;
        length -= 8;
    }
    uint32_t small = (uint32_t)value;
    while (length--) small = __builtin_ia32_crc32qi(small, *bytes++);
    return ~small;
}
#endif

uint32_t cwormhole_crc32c(uint32_t crc, const void *bytes, size_t length) {
#if defined(__x86_64__)
    // Found once; threads that race to find it store the same value (atomically, so that ThreadSanitizer agrees).
    static int has_sse42 = -1;
    int found = __atomic_load_n(&has_sse42, __ATOMIC_RELAXED);
    if (found < 0) {
        found = __builtin_cpu_supports("sse4.2") ? 1 : 0;
        __atomic_store_n(&has_sse42, found, __ATOMIC_RELAXED);
    }
    if (found) return crc32c_sse42(crc, (const uint8_t *)bytes, length);
#endif
    return crc32c_table(crc, (const uint8_t *)bytes, length);
}
