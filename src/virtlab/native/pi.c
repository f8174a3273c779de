/*
 * Decimal digits of pi with MPFR, the "SuperPI m-20" figure: 2^20 decimals by default.
 *
 * Only the computation and the conversion to decimal are timed. The digit string
 * "3.1415..." truncated to exactly N decimals is checked against known digits and summarised
 * by its FNV-1a 64-bit hash, so a run can be compared with an independent computation.
 *
 * Usage: pi [-d DIGITS] [-w]     (-w also prints the digits as pi=3.1415...)
 * Output: digits=N bits=B elapsed_s=... prefix=3.14... fnv1a64=<16 hex> valid=1
 */
#include <getopt.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <gmp.h>
#include <mpfr.h>

#define MAX_DIGITS 100000000L
/* Decimals computed beyond the ones kept, so that truncating a correctly rounded value
 * gives the true digits unless pi has this many 0s or 9s in a row right there. */
#define EXTRA_DIGITS 20
#define PREFIX_DECIMALS 50

static const char known_prefix[] = "3.14159265358979323846264338327950288419716939937510";

static void usage(const char *prog)
{
    fprintf(stderr,
            "usage: %s [-d DIGITS] [-w]\n"
            "  -d DIGITS  decimals after the point, 1..%ld (default 1048576 = 2^20)\n"
            "  -w         also print the digits (pi=3.1415...)\n",
            prog, MAX_DIGITS);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t fnv1a64(const char *text, size_t length)
{
    uint64_t hash = 0xcbf29ce484222325ULL;
    for (size_t n = 0; n < length; n++) {
        hash ^= (unsigned char)text[n];
        hash *= 0x100000001b3ULL;
    }
    return hash;
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
    char *end;
    int opt;

    while ((opt = getopt(argc, argv, "d:w")) != -1) {
        switch (opt) {
        case 'd':
            digits = strtol(optarg, &end, 10);
            if (*end != '\0' || digits < 1 || digits > MAX_DIGITS) {
                usage(argv[0]);
                return 2;
            }
            break;
        case 'w':
            write_digits = 1;
            break;
        default:
            usage(argv[0]);
            return 2;
        }
    }
    if (optind != argc) {
        usage(argv[0]);
        return 2;
    }

    long significant = digits + 1 + EXTRA_DIGITS;
    mpfr_prec_t bits = (mpfr_prec_t)ceil((double)significant * log2(10.0)) + 64;
    mpfr_t pi;
    mpfr_exp_t exponent;

    double t0 = now_s();
    mpfr_init2(pi, bits);
    mpfr_const_pi(pi, MPFR_RNDN);
    char *raw = mpfr_get_str(NULL, &exponent, 10, (size_t)significant, pi, MPFR_RNDN);
    double elapsed = now_s() - t0;

    if (raw == NULL || exponent != 1) {
        fprintf(stderr, "pi: conversion failed\n");
        return 1;
    }
    /* Truncation is only certain when the extra decimals are not all 0 or all 9. */
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
           (long)bits, elapsed, shown + 2, text,
           (unsigned long long)fnv1a64(text, (size_t)digits + 2), valid);

    free(text);
    mpfr_free_str(raw);
    mpfr_clear(pi);
    mpfr_free_cache();
    return valid ? 0 : 1;
}
