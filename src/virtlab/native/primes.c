/*
 * The prime program of seed 002: check 1..N one by one by trial division up to the square root
 * and print every prime on its own line. Printing is part of the measurement (the seed's sys time
 * is mostly the writes); -q leaves it out.
 *
 * The count is checked afterwards, outside the timed part, against a sieve of Eratosthenes.
 *
 * Usage: primes [-n N] [-q]
 * Output: one prime per line, then count=... real_s=... user_s=... sys_s=... valid=1
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "virtlab_kernel.h"

static void usage(const char *prog)
{
    fprintf(stderr,
            "usage: %s [-n N] [-q]\n"
            "  -n N  check 1..N, 1 <= N <= 4294967295 (default 10000000)\n"
            "  -q    do not print the primes, only the summary\n",
            prog);
}

static int is_prime(uint32_t n)
{
    if (n < 2)
        return 0;
    if (n % 2 == 0)
        return n == 2;
    for (uint32_t d = 3; (uint64_t)d * d <= n; d += 2)
        if (n % d == 0)
            return 0;
    return 1;
}

/* Primes <= n by a sieve over the odd numbers, to check the trial divisions. */
static long sieve_count(uint32_t n)
{
    if (n < 2)
        return 0;
    size_t odd = ((size_t)n - 1) / 2; /* odd numbers 3..n: index k stands for 2k+3 */
    unsigned char *composite = calloc(odd + 1, 1);
    if (composite == NULL)
        return -1;
    for (size_t k = 0; k < odd; k++) {
        uint64_t p = 2 * (uint64_t)k + 3;
        if (p * p > n)
            break;
        if (!composite[k])
            for (uint64_t m = p * p; m <= n; m += 2 * p)
                composite[(m - 3) / 2] = 1;
    }
    long count = 1; /* the prime 2 */
    for (size_t k = 0; k < odd; k++)
        count += !composite[k];
    free(composite);
    return count;
}

int main(int argc, char **argv)
{
    long limit = 10000000;
    int quiet = 0;
    const KernelOption options[] = {
        {'n', 1, UINT32_MAX, &limit, NULL},
        {'q', 0, 0, NULL, &quiet},
    };
    if (!parse_kernel_options(argc, argv, options, COUNT_OF(options))) {
        usage(argv[0]);
        return 2;
    }

    struct rusage before, after;
    getrusage(RUSAGE_SELF, &before);
    double t0 = now_s();
    long count = 0;
    for (uint64_t n = 1; n <= (uint64_t)limit; n++) {
        if (is_prime((uint32_t)n)) {
            count++;
            if (!quiet)
                printf("%u\n", (unsigned)n);
        }
    }
    fflush(stdout);
    double real = now_s() - t0;
    getrusage(RUSAGE_SELF, &after);

    long expected = sieve_count((uint32_t)limit);
    int valid = expected == count;
    printf("count=%ld n=%llu real_s=%.6f user_s=%.6f sys_s=%.6f valid=%d\n", count,
           (unsigned long long)limit, real,
           timeval_s(after.ru_utime) - timeval_s(before.ru_utime),
           timeval_s(after.ru_stime) - timeval_s(before.ru_stime), valid);
    return valid ? 0 : 1;
}
