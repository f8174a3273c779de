/*
 * webcgi: the CGI program of the web workload (seed 001's STD-CGI profile runs "a CGI program" for
 * a share of the requests). fcgiwrap forks and executes it once per request, as a CGI server does:
 * the process creation is half of what such a request costs; this program is the other half, some
 * real work on the server's own data.
 *
 * It reads the page the web server also serves statically ($DOCUMENT_ROOT/page.html) and hashes
 * it R times in a row (FNV-1a, 64 bits, one running hash over the page repeated R times: a chain of
 * dependent multiplications that no compiler can shorten), then answers with the hash in hex. The
 * client knows the page and checks every answer, so a request that did not do the work counts as
 * an error.
 *
 * Request: GET /cgi-bin/webcgi?rounds=R   (1 <= R <= 100000)
 * Answer:  Content-Type: text/plain, X-Virtlab-Cgi: 1, body "<16 hex digits>\n".
 * Anything wrong: Status 500 and the reason in the body (and exit status 1).
 *
 * Run by hand with --self-test it hashes a known string and prints valid=1 when the hash is FNV-1a's
 * published value, the kernel's own check.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "virtlab_kernel.h"

#define MAX_PAGE (16L << 20)
#define MAX_ROUNDS 100000L

static int fail(const char *what, const char *detail)
{
    printf("Status: 500 Internal Server Error\r\nContent-Type: text/plain\r\n\r\nwebcgi: %s%s%s\n", what,
           detail ? ": " : "", detail ? detail : "");
    return 1;
}

/* R from a query string "rounds=R" (other keys ignored); 0 when absent or out of range. */
static long rounds_of(const char *query)
{
    for (const char *p = query; p && *p;) {
        if (strncmp(p, "rounds=", 7) == 0) {
            char *end;
            errno = 0;
            long value = strtol(p + 7, &end, 10);
            if (errno || end == p + 7 || (*end && *end != '&') || value < 1 || value > MAX_ROUNDS)
                return 0;
            return value;
        }
        p = strchr(p, '&');
        if (p)
            p++;
    }
    return 0;
}

static int self_test(void)
{
    /* FNV-1a 64 of "a" is 0xaf63dc4c8601ec8c (the algorithm's published test vector). */
    unsigned long long hash = fnv1a64(FNV1A64_OFFSET, "a", 1);
    printf("fnv1a_a=%016llx valid=%d\n", hash, hash == 0xaf63dc4c8601ec8cULL);
    return hash == 0xaf63dc4c8601ec8cULL ? 0 : 1;
}

int main(int argc, char **argv)
{
    if (argc > 1)
        return strcmp(argv[1], "--self-test") == 0 ? self_test() : 2;
    const char *root = getenv("DOCUMENT_ROOT");
    long rounds = rounds_of(getenv("QUERY_STRING"));
    if (!root || !*root)
        return fail("no DOCUMENT_ROOT from the server", NULL);
    if (rounds == 0)
        return fail("the query needs rounds=R, 1 <= R <= 100000", NULL);
    char path[4096];
    if (snprintf(path, sizeof path, "%s/page.html", root) >= (int)sizeof path)
        return fail("DOCUMENT_ROOT is too long", NULL);
    FILE *file = fopen(path, "rb");
    if (!file)
        return fail(path, strerror(errno));
    struct stat info;
    unsigned char *page = NULL;
    size_t size = 0;
    if (fstat(fileno(file), &info) == 0 && info.st_size > 0 && info.st_size <= MAX_PAGE) {
        size = (size_t)info.st_size;
        page = malloc(size);
    }
    int error = page == NULL || fread(page, 1, size, file) != size;
    fclose(file);
    if (error) {
        free(page);
        return fail(path, "unreadable, empty or larger than 16 MiB");
    }
    unsigned long long hash = FNV1A64_OFFSET;
    for (long r = 0; r < rounds; r++)
        hash = fnv1a64(hash, page, size);
    free(page);
    printf("Content-Type: text/plain\r\nX-Virtlab-Cgi: 1\r\n\r\n%016llx\n", hash);
    return 0;
}
