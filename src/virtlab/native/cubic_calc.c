/*
 * cubic_calc (seed 004): a CPU-intensive program that solves cubic equations
 * x^3 + a x^2 + b x + c = 0 one after another and reports how many it finished in each second.
 *
 * The coefficients come from a fixed-seed LCG and live in a small working buffer (-m MB) that
 * is walked in order, so the program stays in the caches: the low-LLC-miss-rate counterpart of
 * malloc_access. Cardano's formula (in its cancellation-free form) gives the single real root,
 * the trigonometric method the three real roots; every root is checked by substituting it back.
 *
 * Usage: cubic_calc [-d SECONDS] [-m MB]
 * Output: t=1 ops=...  (one line per second, flushed), then
 *         ops_total=... ops_per_s=... elapsed_s=... failures=0 valid=1
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "virtlab_kernel.h"

#define CHECK_EVERY 256 /* equations between two looks at the clock */
#define RESIDUAL_TOLERANCE 1e-9

typedef struct {
    double a, b, c; /* coefficients of the monic cubic */
    double root;    /* the largest real root found, written back so the work is kept */
} Equation;

static void usage(const char *prog)
{
    fprintf(stderr,
            "usage: %s [-d SECONDS] [-m MB]\n"
            "  -d SECONDS  how long to run, >= 1 (default 60)\n"
            "  -m MB       working memory in MiB, >= 1 (default 1)\n",
            prog);
}

/* Real roots of x^3 + a x^2 + b x + c; returns how many (1 or 3). */
static int solve_cubic(double a, double b, double c, double roots[3])
{
    /* Depressed cubic t^3 + p t + q with x = t - a/3. */
    double shift = a / 3.0;
    double p = b - a * shift;
    double q = (2.0 * shift * shift - b) * shift + c;
    double disc = 0.25 * q * q + p * p * p / 27.0;

    if (p == 0.0) {
        roots[0] = cbrt(-q) - shift;
        return 1;
    }
    if (disc > 0.0) {
        /* u^3 picks the sign of -q so that no cancellation happens; v = -p / (3u). */
        double u = cbrt(-0.5 * q - copysign(sqrt(disc), q));
        roots[0] = u - p / (3.0 * u) - shift;
        return 1;
    }
    double r = 2.0 * sqrt(-p / 3.0);
    double cos3 = 1.5 * q / p * sqrt(-3.0 / p);
    double phi = acos(fmax(-1.0, fmin(1.0, cos3))) / 3.0;
    for (int k = 0; k < 3; k++)
        roots[k] = r * cos(phi - 2.0 * M_PI * k / 3.0) - shift;
    return 3;
}

static int root_checks(double a, double b, double c, double x)
{
    double value = ((x + a) * x + b) * x + c;
    double ax = fabs(x);
    double scale = ((ax + fabs(a)) * ax + fabs(b)) * ax + fabs(c);
    return fabs(value) <= RESIDUAL_TOLERANCE * scale + 1e-300;
}

static double lcg_uniform(uint64_t *state)
{
    *state = *state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (double)(*state >> 11) * 0x1.0p-53;
}

int main(int argc, char **argv)
{
    long duration = 60, memory_mb = 1;
    const KernelOption options[] = {
        {'d', 1, 100000000, &duration, NULL},
        {'m', 1, 1L << 24, &memory_mb, NULL},
    };
    if (!parse_kernel_options(argc, argv, options, COUNT_OF(options))) {
        usage(argv[0]);
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);

    size_t count = (size_t)memory_mb * 1024 * 1024 / sizeof(Equation);
    Equation *eq = malloc(count * sizeof *eq);
    if (eq == NULL) {
        fprintf(stderr, "cubic_calc: out of memory for %ld MiB\n", memory_mb);
        return 1;
    }
    uint64_t state = 20170101;
    for (size_t n = 0; n < count; n++) {
        eq[n].a = 20.0 * lcg_uniform(&state) - 10.0;
        eq[n].b = 20.0 * lcg_uniform(&state) - 10.0;
        eq[n].c = 20.0 * lcg_uniform(&state) - 10.0;
        eq[n].root = 0.0;
    }

    long long failures = 0;
    size_t next = 0;
    SecondCounts counts = second_counts_start(duration);
    do {
        for (int n = 0; n < CHECK_EVERY; n++) {
            Equation *e = &eq[next];
            double roots[3];
            int found = solve_cubic(e->a, e->b, e->c, roots);
            double largest = roots[0];
            for (int k = 0; k < found; k++) {
                failures += !root_checks(e->a, e->b, e->c, roots[k]);
                largest = fmax(largest, roots[k]);
            }
            e->root = largest;
            if (++next == count)
                next = 0;
        }
    } while (second_counts_add(&counts, CHECK_EVERY));
    long long ops_total = counts.ops_total;
    double elapsed = counts.now - counts.start;

    int valid = failures == 0;
    printf("ops_total=%lld ops_per_s=%.1f elapsed_s=%.6f memory_mb=%ld failures=%lld valid=%d\n",
           ops_total, (double)ops_total / elapsed, elapsed, memory_mb, failures, valid);
    free(eq);
    return valid ? 0 : 1;
}
