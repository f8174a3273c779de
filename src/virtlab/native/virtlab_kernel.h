/*
 * virtlab_kernel.h: the helpers the kernels share (the clock, whole numbers and options from the
 * command line, the per-second operation counts, FNV-1a, paths). Everything is static inline, so a
 * kernel stays one program that links nothing more.
 *
 * virtlab.build puts this file's text in place of the #include line (with #line marks, so compiler
 * messages name this file): a kernel's source is one self-contained file wherever it is compiled,
 * on this host or copied alone to an SSH host.
 */
#ifndef VIRTLAB_KERNEL_H
#define VIRTLAB_KERNEL_H

#include <errno.h>
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

/* Seconds on the monotonic clock. */
static inline double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline double timeval_s(struct timeval tv)
{
    return (double)tv.tv_sec + (double)tv.tv_usec * 1e-6;
}

/* 1 and *value set when text is a whole decimal number in [low, high] and nothing else; else 0. */
static inline int parse_long(const char *text, long low, long high, long *value)
{
    char *end;
    errno = 0;
    long parsed = strtol(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || parsed < low || parsed > high)
        return 0;
    *value = parsed;
    return 1;
}

#define COUNT_OF(array) ((int)(sizeof(array) / sizeof((array)[0])))

/* One command-line option: -LETTER NUMBER, low <= NUMBER <= high, into *number; or, with flag
 * set instead, a -LETTER without argument that sets *flag to 1. */
typedef struct {
    char letter;
    long low, high;
    long *number;
    int *flag;
} KernelOption;

/* Reads argv's options against options[0..count): 1 when each is one of them, each number is in
 * range and no operand follows; 0 otherwise (the kernel then prints its usage and exits with 2). */
static inline int parse_kernel_options(int argc, char **argv, const KernelOption *options, int count)
{
    char spec[2 * 64 + 1];
    int used = 0;
    for (int i = 0; i < count && used < (int)sizeof spec - 2; i++) {
        spec[used++] = options[i].letter;
        if (options[i].flag == NULL)
            spec[used++] = ':';
    }
    spec[used] = '\0';
    int letter;
    while ((letter = getopt(argc, argv, spec)) != -1) {
        const KernelOption *option = NULL;
        for (int i = 0; i < count; i++)
            if (options[i].letter == letter)
                option = &options[i];
        if (option == NULL)
            return 0;
        if (option->flag != NULL)
            *option->flag = 1;
        else if (!parse_long(optarg, option->low, option->high, option->number))
            return 0;
    }
    return optind == argc;
}

/* Operations counted second by second for `duration` seconds: one "t=N ops=M" line per second. */
typedef struct {
    long duration, second;
    long long ops_total, ops_second;
    double start, boundary, now;
} SecondCounts;

static inline SecondCounts second_counts_start(long duration)
{
    double start = now_s();
    SecondCounts counts = {duration, 0, 0, 0, start, start + 1.0, start};
    return counts;
}

/* Adds ops done since the last call and prints the seconds that have ended; 0 once `duration`
 * seconds have. */
static inline int second_counts_add(SecondCounts *counts, long long ops)
{
    counts->ops_second += ops;
    counts->now = now_s();
    /* A stall longer than a second (a paused or migrating VM) shows as seconds with 0 ops. */
    while (counts->now >= counts->boundary && counts->second < counts->duration) {
        counts->second++;
        printf("t=%ld ops=%lld\n", counts->second, counts->ops_second);
        counts->ops_total += counts->ops_second;
        counts->ops_second = 0;
        counts->boundary += 1.0;
    }
    return counts->second < counts->duration;
}

#define FNV1A64_OFFSET 0xcbf29ce484222325ULL

/* FNV-1a, 64 bits, continued from hash (FNV1A64_OFFSET to start) over length bytes. */
static inline uint64_t fnv1a64(uint64_t hash, const void *bytes, size_t length)
{
    const unsigned char *byte = bytes;
    for (size_t n = 0; n < length; n++) {
        hash ^= byte[n];
        hash *= 0x100000001b3ULL;
    }
    return hash;
}

/* "dir/name" in fresh memory (the caller frees it); NULL when out of memory. */
static inline char *join(const char *dir, const char *name)
{
    size_t size = strlen(dir) + strlen(name) + 2;
    char *path = malloc(size);
    if (path != NULL)
        snprintf(path, size, "%s/%s", dir, name);
    return path;
}

#endif
