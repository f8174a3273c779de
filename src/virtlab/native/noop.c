/*
 * noop: starts, does nothing measurable and says so. A trial of it measures what the harness
 * and the environment cost per trial (process start, transport, parsing), nothing else.
 *
 * Usage: noop
 * Output: ok=1
 */
#include <getopt.h>
#include <stdio.h>

int main(int argc, char **argv)
{
    if (getopt(argc, argv, "") != -1 || optind != argc) {
        fprintf(stderr, "usage: %s\n", argv[0]);
        return 2;
    }
    printf("ok=1\n");
    return 0;
}
