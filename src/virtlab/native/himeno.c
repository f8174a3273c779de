/*
 * Himeno benchmark: Jacobi iteration for Poisson's equation on a 3-D grid (after RIKEN's
 * himenoBMTxpa.c): the 19-point stencil, single precision, the a/b/c/p/bnd/wrk1/wrk2 arrays,
 * omega = 0.8, 34 floating-point operations per interior point and iteration.
 *
 * Grid names follow the seed's spelling (M = 256x128x128): I is the contiguous, innermost
 * dimension (the original's k), K the outermost (the original's i, along which p is initialised),
 * so gosa matches the original program for the same size and iteration count.
 *
 * Usage: himeno [-s XS|S|M|L | -g I,J,K] [-n ITERATIONS | -t SECONDS]
 * Output: grid=IxJxK iterations=N gosa=... mflops=... elapsed_s=... valid=1
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "virtlab_kernel.h"

typedef struct {
    float *m;
    int n; /* number of stacked grids (a has 4, b and c have 3) */
    int ni, nj, nk;
} Matrix;

#define MR(mt, l, i, j, k) \
    ((mt)->m[(size_t)(l) * (mt)->ni * (mt)->nj * (mt)->nk + ((size_t)(i) * (mt)->nj + (j)) * (mt)->nk + (k)])

static const float omega = 0.8f;

static void usage(const char *prog)
{
    fprintf(stderr,
            "usage: %s [-s XS|S|M|L | -g I,J,K] [-n ITERATIONS | -t SECONDS]\n"
            "  -s SIZE   XS=64x32x32 S=128x64x64 M=256x128x128 L=512x256x256 (default M)\n"
            "  -g I,J,K  explicit grid, each >= 3 (I innermost)\n"
            "  -n N      run exactly N iterations (deterministic gosa)\n"
            "  -t SEC    otherwise: time 3 iterations, then run about SEC seconds (default 10)\n",
            prog);
}

static int new_mat(Matrix *mat, int n, int ni, int nj, int nk)
{
    mat->n = n;
    mat->ni = ni;
    mat->nj = nj;
    mat->nk = nk;
    mat->m = malloc((size_t)n * ni * nj * nk * sizeof(float));
    return mat->m != NULL;
}

static void mat_set(Matrix *mat, int l, float value)
{
    for (int i = 0; i < mat->ni; i++)
        for (int j = 0; j < mat->nj; j++)
            for (int k = 0; k < mat->nk; k++)
                MR(mat, l, i, j, k) = value;
}

static void mat_set_init(Matrix *mat)
{
    for (int i = 0; i < mat->ni; i++)
        for (int j = 0; j < mat->nj; j++)
            for (int k = 0; k < mat->nk; k++)
                MR(mat, 0, i, j, k) = (float)(i * i) / (float)((mat->ni - 1) * (mat->ni - 1));
}

static float jacobi(int nn, Matrix *a, Matrix *b, Matrix *c, Matrix *p, Matrix *bnd, Matrix *wrk1,
                    Matrix *wrk2)
{
    int imax = p->ni - 1, jmax = p->nj - 1, kmax = p->nk - 1;
    float gosa = 0.0f;

    for (int n = 0; n < nn; n++) {
        gosa = 0.0f;
        for (int i = 1; i < imax; i++)
            for (int j = 1; j < jmax; j++)
                for (int k = 1; k < kmax; k++) {
                    float s0 = MR(a, 0, i, j, k) * MR(p, 0, i + 1, j, k)
                             + MR(a, 1, i, j, k) * MR(p, 0, i, j + 1, k)
                             + MR(a, 2, i, j, k) * MR(p, 0, i, j, k + 1)
                             + MR(b, 0, i, j, k)
                                   * (MR(p, 0, i + 1, j + 1, k) - MR(p, 0, i + 1, j - 1, k)
                                      - MR(p, 0, i - 1, j + 1, k) + MR(p, 0, i - 1, j - 1, k))
                             + MR(b, 1, i, j, k)
                                   * (MR(p, 0, i, j + 1, k + 1) - MR(p, 0, i, j - 1, k + 1)
                                      - MR(p, 0, i, j + 1, k - 1) + MR(p, 0, i, j - 1, k - 1))
                             + MR(b, 2, i, j, k)
                                   * (MR(p, 0, i + 1, j, k + 1) - MR(p, 0, i - 1, j, k + 1)
                                      - MR(p, 0, i + 1, j, k - 1) + MR(p, 0, i - 1, j, k - 1))
                             + MR(c, 0, i, j, k) * MR(p, 0, i - 1, j, k)
                             + MR(c, 1, i, j, k) * MR(p, 0, i, j - 1, k)
                             + MR(c, 2, i, j, k) * MR(p, 0, i, j, k - 1)
                             + MR(wrk1, 0, i, j, k);
                    float ss = (s0 * MR(a, 3, i, j, k) - MR(p, 0, i, j, k)) * MR(bnd, 0, i, j, k);
                    gosa += ss * ss;
                    MR(wrk2, 0, i, j, k) = MR(p, 0, i, j, k) + omega * ss;
                }
        for (int i = 1; i < imax; i++)
            for (int j = 1; j < jmax; j++)
                for (int k = 1; k < kmax; k++)
                    MR(p, 0, i, j, k) = MR(wrk2, 0, i, j, k);
    }
    return gosa;
}

/* (I-2)(J-2)(K-2) interior points, 34 flops each: the original's fflop(). */
static double flops_per_iteration(int gi, int gj, int gk)
{
    return (double)(gi - 2) * (double)(gj - 2) * (double)(gk - 2) * 34.0;
}

static int parse_size(const char *name, int grid[3])
{
    static const struct {
        const char *name;
        int i, j, k;
    } sizes[] = {{"XS", 64, 32, 32}, {"S", 128, 64, 64}, {"M", 256, 128, 128}, {"L", 512, 256, 256}};
    for (size_t n = 0; n < sizeof sizes / sizeof sizes[0]; n++)
        if (strcasecmp(name, sizes[n].name) == 0) {
            grid[0] = sizes[n].i;
            grid[1] = sizes[n].j;
            grid[2] = sizes[n].k;
            return 1;
        }
    return 0;
}

static int parse_grid(const char *text, int grid[3])
{
    char tail;
    if (sscanf(text, "%d,%d,%d%c", &grid[0], &grid[1], &grid[2], &tail) != 3)
        return 0;
    for (int n = 0; n < 3; n++)
        if (grid[n] < 3 || grid[n] > 65536)
            return 0;
    return 1;
}

int main(int argc, char **argv)
{
    int grid[3] = {256, 128, 128};
    int iterations = 0, have_size = 0, have_grid = 0;
    double target_s = 10.0;
    char *end;
    int opt;

    while ((opt = getopt(argc, argv, "s:g:n:t:")) != -1) {
        switch (opt) {
        case 's':
            if (!parse_size(optarg, grid)) {
                usage(argv[0]);
                return 2;
            }
            have_size = 1;
            break;
        case 'g':
            if (!parse_grid(optarg, grid)) {
                usage(argv[0]);
                return 2;
            }
            have_grid = 1;
            break;
        case 'n':
            iterations = (int)strtol(optarg, &end, 10);
            if (*end != '\0' || iterations < 1) {
                usage(argv[0]);
                return 2;
            }
            break;
        case 't':
            target_s = strtod(optarg, &end);
            if (*end != '\0' || !(target_s > 0.0)) {
                usage(argv[0]);
                return 2;
            }
            break;
        default:
            usage(argv[0]);
            return 2;
        }
    }
    if (optind != argc || (have_size && have_grid)) {
        usage(argv[0]);
        return 2;
    }

    /* Storage order as in the original: [K][J][I], I contiguous. */
    int ni = grid[2], nj = grid[1], nk = grid[0];
    Matrix a, b, c, p, bnd, wrk1, wrk2;
    if (!new_mat(&p, 1, ni, nj, nk) || !new_mat(&bnd, 1, ni, nj, nk) || !new_mat(&wrk1, 1, ni, nj, nk)
        || !new_mat(&wrk2, 1, ni, nj, nk) || !new_mat(&a, 4, ni, nj, nk) || !new_mat(&b, 3, ni, nj, nk)
        || !new_mat(&c, 3, ni, nj, nk)) {
        fprintf(stderr, "himeno: out of memory for grid %dx%dx%d\n", grid[0], grid[1], grid[2]);
        return 1;
    }
    mat_set(&bnd, 0, 1.0f);
    mat_set(&wrk1, 0, 0.0f);
    mat_set(&wrk2, 0, 0.0f);
    for (int l = 0; l < 3; l++) {
        mat_set(&a, l, 1.0f);
        mat_set(&b, l, 0.0f);
        mat_set(&c, l, 1.0f);
    }
    mat_set(&a, 3, 1.0f / 6.0f);

    double flop = flops_per_iteration(grid[0], grid[1], grid[2]);
    if (iterations == 0) {
        /* The original's rehearsal: 3 iterations tell how many fit in the target time. */
        mat_set_init(&p);
        double t0 = now_s();
        jacobi(3, &a, &b, &c, &p, &bnd, &wrk1, &wrk2);
        double rehearsal = now_s() - t0;
        double per_iteration = rehearsal / 3.0;
        iterations = per_iteration > 0.0 ? (int)fmin(target_s / per_iteration, 1e9) : 1000;
        if (iterations < 1)
            iterations = 1;
        printf("rehearsal_iterations=3 rehearsal_s=%.6f\n", rehearsal);
    }

    /* Unlike the original, the measured run restarts from the initial p, so that gosa depends
     * only on the grid and the iteration count and can be checked. */
    mat_set_init(&p);
    mat_set(&wrk2, 0, 0.0f);
    double t0 = now_s();
    float gosa = jacobi(iterations, &a, &b, &c, &p, &bnd, &wrk1, &wrk2);
    double elapsed = now_s() - t0;
    double mflops = elapsed > 0.0 ? flop * iterations / elapsed * 1e-6 : 0.0;

    /* A diverging or corrupted iteration shows as a non-finite or negative sum of squares. */
    int valid = isfinite(gosa) && gosa >= 0.0f;
    printf("grid=%dx%dx%d iterations=%d gosa=%.9e mflops=%.6f elapsed_s=%.9f valid=%d\n", grid[0],
           grid[1], grid[2], iterations, (double)gosa, mflops, elapsed, valid);

    free(a.m);
    free(b.m);
    free(c.m);
    free(p.m);
    free(bnd.m);
    free(wrk1.m);
    free(wrk2.m);
    return valid ? 0 : 1;
}
