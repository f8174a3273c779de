/*
 * malloc_access (seed 004): a memory-intensive program that allocates a large buffer (2 GiB by
 * default) and keeps accessing it, reporting the accesses finished in each second.
 *
 * Every access increments one 64-bit word in a cache line chosen by a 64-bit LCG over the
 * whole buffer, so nearly every access misses the caches and the TLB and dirties a line: the
 * high-LLC-miss-rate, high-bandwidth counterpart of cubic_calc. The indices do not depend on
 * loaded data, so the processor overlaps many misses, as a bandwidth-hungry program does.
 * All pages are written before the clock starts (init_s); afterwards the increments in the
 * buffer must add up to the number of accesses made.
 *
 * Usage: malloc_access [-d SECONDS] [-m MB]
 * Output: init_s=... memory_mb=...; t=1 ops=... (one line per second, flushed); then
 *         ops_total=... ops_per_s=... elapsed_s=... valid=1
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "virtlab_kernel.h"

#define CHECK_EVERY 4096 /* accesses between two looks at the clock */
#define LINE_WORDS 8     /* 64-byte cache line of 64-bit words */
/* Not zero: the compiler turns malloc + memset(0) into calloc, which leaves the pages untouched. */
#define FILL_BYTE 0x01
#define FILL_WORD 0x0101010101010101ULL

static void usage(const char *prog)
{
    fprintf(stderr,
            "usage: %s [-d SECONDS] [-m MB]\n"
            "  -d SECONDS  how long to run, >= 1 (default 60)\n"
            "  -m MB       buffer size in MiB, >= 1 (default 2048)\n",
            prog);
}

int main(int argc, char **argv)
{
    long duration = 60, memory_mb = 2048;
    const KernelOption options[] = {
        {'d', 1, 100000000, &duration, NULL},
        {'m', 1, 1L << 24, &memory_mb, NULL},
    };
    if (!parse_kernel_options(argc, argv, options, COUNT_OF(options))) {
        usage(argv[0]);
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);

    size_t bytes = (size_t)memory_mb * 1024 * 1024;
    uint64_t lines = bytes / (LINE_WORDS * sizeof(uint64_t));
    uint64_t *buffer = malloc(bytes);
    if (buffer == NULL) {
        fprintf(stderr, "malloc_access: cannot allocate %ld MiB\n", memory_mb);
        return 1;
    }
    double t0 = now_s();
    memset(buffer, FILL_BYTE, bytes);
    printf("init_s=%.6f memory_mb=%ld\n", now_s() - t0, memory_mb);

    uint64_t state = 20170101;
    SecondCounts counts = second_counts_start(duration);
    do {
        for (int n = 0; n < CHECK_EVERY; n++) {
            state = state * 6364136223846793005ULL + 1442695040888963407ULL;
            /* The high bits of the LCG are the random ones; scale them onto [0, lines). */
            uint64_t line = (uint64_t)(((unsigned __int128)state * lines) >> 64);
            buffer[line * LINE_WORDS]++;
        }
    } while (second_counts_add(&counts, CHECK_EVERY));
    long long ops_total = counts.ops_total;
    double elapsed = counts.now - counts.start;

    /* Each access added 1 to one word; sums wrap modulo 2^64 on both sides alike. */
    uint64_t sum = 0;
    for (uint64_t line = 0; line < lines; line++)
        sum += buffer[line * LINE_WORDS];
    int valid = sum == lines * FILL_WORD + (uint64_t)ops_total;
    printf("ops_total=%lld ops_per_s=%.1f elapsed_s=%.6f memory_mb=%ld valid=%d\n", ops_total,
           (double)ops_total / elapsed, elapsed, memory_mb, valid);
    free(buffer);
    return valid ? 0 : 1;
}
