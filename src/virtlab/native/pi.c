/*
 * Decimal digits of pi with GMP, the "SuperPI m-20" figure: 2^20 decimals by default.
 *
 * The Chudnovsky series summed by binary splitting in GMP integers, then one integer square
 * root and one division: floor(pi * 10^(N + extra)) as an integer, converted to decimal by GMP.
 * (MPFR's mpfr_const_pi was 1.3x slower than Debian's CLN `pi` at 2^20 digits on our machines;
 * this is the method CLN and y-cruncher use.)
 *
 * Only the computation and the conversion to decimal are timed. The digit string
 * "3.1415..." truncated to exactly N decimals is checked against known digits and summarised
 * by its FNV-1a 64-bit hash, so a run can be compared with an independent computation.
 *
 * Usage: pi [-d DIGITS] [-w]     (-w also prints the digits as pi=3.1415...)
 * Output: digits=N bits=B elapsed_s=... prefix=3.14... fnv1a64=<16 hex> valid=1
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <gmp.h>

#include "virtlab_kernel.h"

#define MAX_DIGITS 100000000L
/* Decimals computed beyond the ones kept, so that truncating a correctly rounded value
 * gives the true digits unless pi has this many 0s or 9s in a row right there. */
#define EXTRA_DIGITS 20
#define PREFIX_DECIMALS 50

/* 640320^3 / 24: the denominator constant of each Chudnovsky term (fits in 64 bits). */
#define C3_OVER_24 10939058860032000UL
/* Each term of the series adds log10(640320^3 / 1728) = 14.18... decimal digits. */
#define DIGITS_PER_TERM 14.181647462725477

/* P, Q, T of the terms a..b-1, so that the partial sum is T / Q (binary splitting). */
static void split(unsigned long a, unsigned long b, mpz_t P, mpz_t Q, mpz_t T)
{
    if (b - a == 1) {
        if (a == 0) {
            mpz_set_ui(P, 1);
            mpz_set_ui(Q, 1);
        } else {
            mpz_set_ui(P, 6 * a - 5);
            mpz_mul_ui(P, P, 2 * a - 1);
            mpz_mul_ui(P, P, 6 * a - 1);
            mpz_set_ui(Q, a);
            mpz_mul_ui(Q, Q, a);
            mpz_mul_ui(Q, Q, a);
            mpz_mul_ui(Q, Q, C3_OVER_24);
        }
        mpz_mul_ui(T, P, 13591409UL + 545140134UL * a);
        if (a & 1)
            mpz_neg(T, T);
        return;
    }
    unsigned long m = a + (b - a) / 2;
    mpz_t P2, Q2, T2;
    mpz_inits(P2, Q2, T2, NULL);
    split(a, m, P, Q, T);
    split(m, b, P2, Q2, T2);
    mpz_mul(T, T, Q2);
    mpz_mul(T2, T2, P);
    mpz_add(T, T, T2);
    mpz_mul(P, P, P2);
    mpz_mul(Q, Q, Q2);
    mpz_clears(P2, Q2, T2, NULL);
}

/* floor(pi * 10^decimals) in decimal: "31415..." (decimals + 1 characters). */
static char *pi_digits(long decimals)
{
    unsigned long terms = (unsigned long)((double)decimals / DIGITS_PER_TERM) + 2;
    mpz_t P, Q, T, root, pi;
    mpz_inits(P, Q, T, root, pi, NULL);
    split(0, terms, P, Q, T);
    /* pi = 426880 * sqrt(10005) * Q / T, scaled by 10^decimals in integers */
    mpz_ui_pow_ui(root, 10, 2 * (unsigned long)decimals);
    mpz_mul_ui(root, root, 10005);
    mpz_sqrt(root, root);
    mpz_mul(pi, Q, root);
    mpz_mul_ui(pi, pi, 426880);
    mpz_tdiv_q(pi, pi, T);
    char *text = mpz_get_str(NULL, 10, pi);
    mpz_clears(P, Q, T, root, pi, NULL);
    return text;
}

static const char known_prefix[] = "3.14159265358979323846264338327950288419716939937510";

static void usage(const char *prog)
{
    fprintf(stderr,
            "usage: %s [-d DIGITS] [-w]\n"
            "  -d DIGITS  decimals after the point, 1..%ld (default 1048576 = 2^20)\n"
            "  -w         also print the digits (pi=3.1415...)\n",
            prog, MAX_DIGITS);
}

/* The digits must start as pi does, and decimals 762-767 are the Feynman point "999999". */
static int check_digits(const char *text, long digits)
{
    size_t length = strlen(text);
    if (length != (size_t)digits + 2 || text[0] != '3' || text[1] != '.')
        return 0;
    for (size_t n = 2; n < length; n++)
        if (text[n] < '0' || text[n] > '9')
            return 0;
    size_t known = sizeof known_prefix - 1;
    if (strncmp(text, known_prefix, length < known ? length : known) != 0)
        return 0;
    if (digits >= 767 && strncmp(text + 1 + 762, "999999", 6) != 0)
        return 0;
    return 1;
}

int main(int argc, char **argv)
{
    long digits = 1L << 20;
    int write_digits = 0;
    const KernelOption options[] = {
        {'d', 1, MAX_DIGITS, &digits, NULL},
        {'w', 0, 0, NULL, &write_digits},
    };
    if (!parse_kernel_options(argc, argv, options, COUNT_OF(options))) {
        usage(argv[0]);
        return 2;
    }

    long significant = digits + 1 + EXTRA_DIGITS;
    long bits = (long)ceil((double)significant * log2(10.0));

    double t0 = now_s();
    char *raw = pi_digits(digits + EXTRA_DIGITS);
    double elapsed = now_s() - t0;

    if (raw == NULL || (long)strlen(raw) != significant) {
        fprintf(stderr, "pi: conversion failed\n");
        return 1;
    }
    /* The last few of the extra decimals may be off by the floors of the root and the division;
     * truncation is only certain when the extra decimals are not all 0 or all 9. */
    const char *extra = raw + 1 + digits;
    int ambiguous = strspn(extra, "0") == EXTRA_DIGITS || strspn(extra, "9") == EXTRA_DIGITS;

    char *text = malloc((size_t)digits + 3);
    if (text == NULL) {
        fprintf(stderr, "pi: out of memory\n");
        return 1;
    }
    text[0] = raw[0];
    text[1] = '.';
    memcpy(text + 2, raw + 1, (size_t)digits);
    text[digits + 2] = '\0';

    int valid = !ambiguous && check_digits(text, digits);
    int shown = digits < PREFIX_DECIMALS ? (int)digits : PREFIX_DECIMALS;
    if (write_digits)
        printf("pi=%s\n", text);
    printf("digits=%ld bits=%ld elapsed_s=%.6f prefix=%.*s fnv1a64=%016llx valid=%d\n", digits,
           bits, elapsed, shown + 2, text,
           (unsigned long long)fnv1a64(FNV1A64_OFFSET, text, (size_t)digits + 2), valid);

    free(text);
    void (*release)(void *, size_t);
    mp_get_memory_functions(NULL, NULL, &release);
    release(raw, strlen(raw) + 1);
    return valid ? 0 : 1;
}
