/*
 * STREAM copy/scale/add/triad memory bandwidth, with STREAM's rules: arrays a, b, c of N
 * doubles, the best (minimum) time of each kernel over all repetitions but the first, bytes
 * counted as STREAM counts them (copy and scale touch 2 arrays, add and triad 3), MB = 10^6
 * bytes, and the results checked as checkSTREAMresults does.
 *
 * -p P forks P processes, each with its own arrays. Before every kernel of every repetition the
 * processes meet at a barrier kept by the parent over pipes, so that they run the same kernel at
 * the same time; each reports its own best rates and the aggregate is their sum.
 *
 * Usage: stream [-a N] [-r REPS] [-p P]
 * Output: process=0 copy_mbs=... valid=1   (one line per process)
 *         copy_mbs=... scale_mbs=... add_mbs=... triad_mbs=... processes=P array_size=N valid=1
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "virtlab_kernel.h"

#define KERNELS 4
#define MAX_PROCESSES 1024

static const char *const kernel_names[KERNELS] = {"copy", "scale", "add", "triad"};
static const int arrays_touched[KERNELS] = {2, 2, 3, 3};

typedef struct {
    double min_s[KERNELS], avg_s[KERNELS], max_s[KERNELS];
    int valid;
} Report;

typedef struct {
    int ready_fd; /* child -> parent: one byte per barrier, then the Report */
    int go_fd;    /* parent -> child: one byte releases the barrier */
} Channel;

static void usage(const char *prog)
{
    fprintf(stderr,
            "usage: %s [-a N] [-r REPS] [-p P]\n"
            "  -a N     array size in doubles, >= 1000 (default 100000000)\n"
            "  -r REPS  repetitions, >= 2; the first is not counted (default 20)\n"
            "  -p P     processes running at once, 1..%d (default 1)\n",
            prog, MAX_PROCESSES);
}

static int write_all(int fd, const void *data, size_t length)
{
    const char *p = data;
    while (length > 0) {
        ssize_t done = write(fd, p, length);
        if (done < 0 && errno == EINTR)
            continue;
        if (done <= 0)
            return 0;
        p += done;
        length -= (size_t)done;
    }
    return 1;
}

static int read_all(int fd, void *data, size_t length)
{
    char *p = data;
    while (length > 0) {
        ssize_t done = read(fd, p, length);
        if (done < 0 && errno == EINTR)
            continue;
        if (done <= 0)
            return 0;
        p += done;
        length -= (size_t)done;
    }
    return 1;
}

/* A process whose parent or siblings are gone has nobody to report to: it stops. */
static void barrier_wait(const Channel *ch)
{
    char byte = 'r';
    if (!write_all(ch->ready_fd, &byte, 1) || !read_all(ch->go_fd, &byte, 1))
        _exit(1);
}

/* checkSTREAMresults: replay the kernels on scalars and compare the average error. */
static int check_results(const double *a, const double *b, const double *c, long n, int reps)
{
    double aj = 1.0, bj = 2.0, cj = 0.0, scalar = 3.0;
    aj = 2.0 * aj;
    for (int k = 0; k < reps; k++) {
        cj = aj;
        bj = scalar * cj;
        cj = aj + bj;
        aj = bj + scalar * cj;
    }
    double a_err = 0.0, b_err = 0.0, c_err = 0.0;
    for (long j = 0; j < n; j++) {
        a_err += fabs(a[j] - aj);
        b_err += fabs(b[j] - bj);
        c_err += fabs(c[j] - cj);
    }
    const double epsilon = 1.e-13;
    return fabs(a_err / n / aj) <= epsilon && fabs(b_err / n / bj) <= epsilon
        && fabs(c_err / n / cj) <= epsilon;
}

static void run_stream(long n, int reps, const Channel *ch, Report *report)
{
    double *a, *b, *c;
    memset(report, 0, sizeof *report);
    if (posix_memalign((void **)&a, 64, (size_t)n * sizeof(double))
        || posix_memalign((void **)&b, 64, (size_t)n * sizeof(double))
        || posix_memalign((void **)&c, 64, (size_t)n * sizeof(double))) {
        fprintf(stderr, "stream: out of memory for 3 x %ld doubles\n", n);
        /* Keep the barrier count the same so the other processes are not left waiting. */
        for (int k = 0; k < reps * KERNELS; k++)
            barrier_wait(ch);
        return;
    }
    for (long j = 0; j < n; j++) {
        a[j] = 1.0;
        b[j] = 2.0;
        c[j] = 0.0;
    }
    for (long j = 0; j < n; j++)
        a[j] = 2.0 * a[j];

    const double scalar = 3.0;
    double times[KERNELS];
    for (int i = 0; i < KERNELS; i++) {
        report->min_s[i] = INFINITY;
        report->max_s[i] = 0.0;
        report->avg_s[i] = 0.0;
    }
    for (int k = 0; k < reps; k++) {
        double t;
        barrier_wait(ch);
        t = now_s();
        for (long j = 0; j < n; j++)
            c[j] = a[j];
        times[0] = now_s() - t;

        barrier_wait(ch);
        t = now_s();
        for (long j = 0; j < n; j++)
            b[j] = scalar * c[j];
        times[1] = now_s() - t;

        barrier_wait(ch);
        t = now_s();
        for (long j = 0; j < n; j++)
            c[j] = a[j] + b[j];
        times[2] = now_s() - t;

        barrier_wait(ch);
        t = now_s();
        for (long j = 0; j < n; j++)
            a[j] = b[j] + scalar * c[j];
        times[3] = now_s() - t;

        if (k == 0)
            continue; /* STREAM leaves out the first repetition */
        for (int i = 0; i < KERNELS; i++) {
            report->avg_s[i] += times[i];
            report->min_s[i] = fmin(report->min_s[i], times[i]);
            report->max_s[i] = fmax(report->max_s[i], times[i]);
        }
    }
    for (int i = 0; i < KERNELS; i++)
        report->avg_s[i] /= (double)(reps - 1);
    report->valid = check_results(a, b, c, n, reps);
    free(a);
    free(b);
    free(c);
}

static double rate_mbs(long n, int kernel, double seconds)
{
    double bytes = (double)arrays_touched[kernel] * sizeof(double) * (double)n;
    return seconds > 0.0 ? 1.0e-6 * bytes / seconds : 0.0;
}

int main(int argc, char **argv)
{
    long n = 100000000, reps = 20, processes = 1;
    const KernelOption options[] = {
        {'a', 1000, 1L << 40, &n, NULL},
        {'r', 2, 1000000, &reps, NULL},
        {'p', 1, MAX_PROCESSES, &processes, NULL},
    };
    if (!parse_kernel_options(argc, argv, options, COUNT_OF(options))) {
        usage(argv[0]);
        return 2;
    }

    int nproc = (int)processes;
    Channel *parent_end = calloc((size_t)nproc, sizeof *parent_end);
    pid_t *pids = calloc((size_t)nproc, sizeof *pids);
    Report *reports = calloc((size_t)nproc, sizeof *reports);
    if (parent_end == NULL || pids == NULL || reports == NULL) {
        fprintf(stderr, "stream: out of memory\n");
        return 1;
    }
    fflush(stdout);
    for (int p = 0; p < nproc; p++) {
        int ready[2], go[2];
        if (pipe(ready) != 0 || pipe(go) != 0) {
            perror("stream: pipe");
            return 1;
        }
        pids[p] = fork();
        if (pids[p] < 0) {
            perror("stream: fork");
            return 1;
        }
        if (pids[p] == 0) {
            Channel mine = {ready[1], go[0]};
            close(ready[0]);
            close(go[1]);
            for (int q = 0; q < p; q++) {
                close(parent_end[q].ready_fd);
                close(parent_end[q].go_fd);
            }
            Report report;
            run_stream(n, (int)reps, &mine, &report);
            _exit(write_all(mine.ready_fd, &report, sizeof report) ? 0 : 1);
        }
        close(ready[1]);
        close(go[0]);
        parent_end[p].ready_fd = ready[0];
        parent_end[p].go_fd = go[1];
    }

    /* Every process announces it is ready for the next kernel; all are released together. */
    int broken = 0;
    for (long k = 0; k < reps * KERNELS && !broken; k++) {
        char byte;
        for (int p = 0; p < nproc; p++)
            if (!read_all(parent_end[p].ready_fd, &byte, 1))
                broken = 1;
        for (int p = 0; p < nproc && !broken; p++)
            if (!write_all(parent_end[p].go_fd, "g", 1))
                broken = 1;
    }
    int valid = !broken;
    for (int p = 0; p < nproc; p++) {
        if (!broken && !read_all(parent_end[p].ready_fd, &reports[p], sizeof reports[p]))
            valid = 0;
        close(parent_end[p].ready_fd);
        close(parent_end[p].go_fd);
    }
    for (int p = 0; p < nproc; p++) {
        int status;
        if (waitpid(pids[p], &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
            valid = 0;
    }
    if (broken) {
        fprintf(stderr, "stream: a process ended before finishing its repetitions\n");
        printf("processes=%d array_size=%ld valid=0\n", nproc, n);
        return 1;
    }

    double total[KERNELS] = {0.0};
    for (int p = 0; p < nproc; p++) {
        valid = valid && reports[p].valid;
        printf("process=%d", p);
        for (int i = 0; i < KERNELS; i++) {
            double mbs = rate_mbs(n, i, reports[p].min_s[i]);
            total[i] += mbs;
            printf(" %s_mbs=%.1f %s_avg_s=%.9f %s_min_s=%.9f %s_max_s=%.9f", kernel_names[i], mbs,
                   kernel_names[i], reports[p].avg_s[i], kernel_names[i], reports[p].min_s[i],
                   kernel_names[i], reports[p].max_s[i]);
        }
        printf(" valid=%d\n", reports[p].valid);
    }
    for (int i = 0; i < KERNELS; i++)
        printf("%s_mbs=%.1f ", kernel_names[i], total[i]);
    printf("processes=%d array_size=%ld repetitions=%ld bytes_per_word=%zu valid=%d\n", nproc, n, reps,
           sizeof(double), valid);
    return valid ? 0 : 1;
}
