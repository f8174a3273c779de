/*
 * The prime program of seed 002: check 1..N one by one by trial division up to the square root
 * and print every prime on its own line. Printing is part of the measurement (the seed's sys time
 * is mostly the writes); where the primes go decides what they cost:
 *
 *   (none)  standard output, with stdio's buffering for it: full (a few large writes) where it is
 *           a file or a pipe, by line where it is a terminal;
 *   -z      /dev/null, fully buffered: the formatting without a device;
 *   -c      /dev/console, one write per line: a daemon's standard output as init left it, which in
 *           a virtual machine is its serial console (the seed's program, started from init.d);
 *   -t      a pseudo-terminal of its own, one write per line, whose other end a child process reads
 *           and throws away as a terminal would: a console where the program has none of its own
 *           (on a host, in a container); the child's CPU time is not the program's;
 *   -q      nowhere: only the summary.
 *
 * The count is checked afterwards, outside the timed part, against a sieve of Eratosthenes.
 *
 * Usage: primes [-n N] [-q | -z | -c | -t]
 * Output: the primes (on standard output without -z -c -t -q), then count=... real_s=... user_s=...
 * sys_s=... valid=1 output=stdout|null|console|pty|none sink=file|pipe|tty|chardev|socket|none
 * buffering=full|line|none lines=...
 */
#define _XOPEN_SOURCE 700
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "virtlab_kernel.h"

static void usage(const char *prog)
{
    fprintf(stderr,
            "usage: %s [-n N] [-q | -z | -c | -t]\n"
            "  -n N  check 1..N, 1 <= N <= 4294967295 (default 10000000)\n"
            "  -q    do not print the primes, only the summary\n"
            "  -z    print the primes to /dev/null (fully buffered)\n"
            "  -c    print the primes to /dev/console, one write per line\n"
            "  -t    print the primes to a pseudo-terminal of its own, one write per line\n",
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

/* What the stream's descriptor is, for the summary: where the writes went. */
static const char *sink_of(FILE *stream)
{
    struct stat st;
    int fd = fileno(stream);
    if (isatty(fd))
        return "tty";
    if (fstat(fd, &st) != 0)
        return "unknown";
    if (S_ISREG(st.st_mode))
        return "file";
    if (S_ISFIFO(st.st_mode))
        return "pipe";
    if (S_ISSOCK(st.st_mode))
        return "socket";
    if (S_ISCHR(st.st_mode))
        return "chardev";
    return "other";
}

/* A pseudo-terminal whose other end a child process drains (*drain set to its pid): the terminal's
 * side of a console, so that each write goes through the tty layer as it would on a real one. */
static FILE *open_pty(pid_t *drain)
{
    int master = posix_openpt(O_RDWR | O_NOCTTY);
    if (master < 0 || grantpt(master) != 0 || unlockpt(master) != 0)
        return NULL;
    const char *name = ptsname(master);
    FILE *terminal = name != NULL ? fopen(name, "w") : NULL;
    if (terminal == NULL)
        return NULL;
    fflush(stdout); /* nothing of ours is written twice by the child */
    *drain = fork();
    if (*drain < 0)
        return NULL;
    if (*drain == 0) {
        fclose(terminal);
        char buffer[65536];
        /* read() fails with EIO once the program has closed its end: then the terminal is gone */
        while (read(master, buffer, sizeof buffer) > 0)
            ;
        _exit(0);
    }
    close(master);
    return terminal;
}

int main(int argc, char **argv)
{
    long limit = 10000000;
    int quiet = 0, null = 0, console = 0, pty = 0;
    const KernelOption options[] = {
        {'n', 1, UINT32_MAX, &limit, NULL},
        {'q', 0, 0, NULL, &quiet},
        {'z', 0, 0, NULL, &null},
        {'c', 0, 0, NULL, &console},
        {'t', 0, 0, NULL, &pty},
    };
    if (!parse_kernel_options(argc, argv, options, COUNT_OF(options)) || quiet + null + console + pty > 1) {
        usage(argv[0]);
        return 2;
    }

    FILE *out = stdout;
    const char *output = quiet ? "none" : null ? "null" : console ? "console" : pty ? "pty" : "stdout";
    pid_t drain = -1;
    if (null || console) {
        const char *path = null ? "/dev/null" : "/dev/console";
        out = fopen(path, "w");
        if (out == NULL) {
            fprintf(stderr, "primes: cannot open %s: %s\n", path, strerror(errno));
            return 1;
        }
    } else if (pty) {
        out = open_pty(&drain);
        if (out == NULL) {
            fprintf(stderr, "primes: cannot open a pseudo-terminal: %s\n", strerror(errno));
            return 1;
        }
    }
    /* What a daemon's standard output on a console is: a terminal, written line by line. stdio
     * would choose the same for a terminal; said here, so that it does not depend on that. */
    if (console || pty)
        setvbuf(out, NULL, _IOLBF, BUFSIZ);
    const char *sink = quiet ? "none" : sink_of(out);
    const char *buffering = quiet ? "none" : (console || pty || isatty(fileno(out))) ? "line" : "full";

    struct rusage before, after;
    getrusage(RUSAGE_SELF, &before);
    double t0 = now_s();
    long count = 0;
    for (uint64_t n = 1; n <= (uint64_t)limit; n++) {
        if (is_prime((uint32_t)n)) {
            count++;
            if (!quiet)
                fprintf(out, "%u\n", (unsigned)n);
        }
    }
    int written = fflush(out) == 0 && !ferror(out);
    double real = now_s() - t0;
    getrusage(RUSAGE_SELF, &after);
    if (out != stdout)
        written = fclose(out) == 0 && written;
    if (drain > 0)
        waitpid(drain, NULL, 0);
    if (!written) {
        fprintf(stderr, "primes: writing the primes failed\n");
        return 1;
    }

    long expected = sieve_count((uint32_t)limit);
    int valid = expected == count;
    printf("count=%ld n=%llu real_s=%.6f user_s=%.6f sys_s=%.6f valid=%d output=%s sink=%s "
           "buffering=%s lines=%ld\n",
           count, (unsigned long long)limit, real,
           timeval_s(after.ru_utime) - timeval_s(before.ru_utime),
           timeval_s(after.ru_stime) - timeval_s(before.ru_stime), valid, output, sink, buffering,
           quiet ? 0 : count);
    return valid ? 0 : 1;
}
