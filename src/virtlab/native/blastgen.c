/*
 * BLAST (seed 000 section 4.3): blastn from NCBI BLAST+ searching a small nucleotide database.
 *
 * A workload is one command run inside an environment that knows nothing of virtlab, so the
 * database is made here, reproducibly, before the timed search: N random sequences of length L
 * from a fixed-seed PRNG (splitmix64), and Q queries of length l cut from known places in them
 * (half reverse-complemented), each base substituted with probability m. makeblastdb indexes
 * the database; then only this search is timed, with the seed's options:
 *
 *   blastn -query q.fa -db db -task blastn -dust no -outfmt 7 -num_alignments 2
 *          -num_descriptions 2 -out result.txt [-num_threads T]
 *
 * The database is small by default and freshly written, so it sits in the page cache and the
 * search measures the CPU and memory rather than the disk, as the seed intended.
 *
 * The result is checked: every query must be searched, and its top hit must be the sequence it
 * was cut from, so a broken or truncated search cannot pass as a fast one.
 *
 * Usage: blastgen [-n N] [-L LEN] [-q Q] [-l QLEN] [-m RATE] [-s SEED] [-t THREADS] [-w DIR]
 * Output: queries=Q hits=H self_hits=S elapsed_s=... user_s=... sys_s=... makeblastdb_s=...
 *         db_sequences=N db_letters=... db_fnv1a64=<16 hex> ... valid=1
 * The exact commands run are written to standard error.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "virtlab_kernel.h"

#define LINE_WIDTH 80
#define MAX_SEQUENCES 10000000L
#define MAX_LENGTH 100000000L
#define MAX_QUERIES 100000L
#define MAX_THREADS 1024L

struct options {
    long sequences, length, queries, query_length, threads;
    double mutation_rate;
    uint64_t seed;
    const char *work_dir;
};

/* Where each query comes from, decided before the database is generated. */
struct query {
    long source, offset;
    int minus;
    char *bases;
};

struct search_counts {
    long searched, hits, lines, self_hits;
    char version[64];
};

static void usage(const char *prog)
{
    fprintf(stderr,
            "usage: %s [-n N] [-L LEN] [-q Q] [-l QLEN] [-m RATE] [-s SEED] [-t THREADS] [-w DIR]\n"
            "  -n N        database sequences, 1..%ld (default 2000)\n"
            "  -L LEN      length of each database sequence, 1..%ld (default 5000)\n"
            "  -q Q        queries, 1..%ld (default 1000)\n"
            "  -l QLEN     length of each query, 1..LEN (default 1000)\n"
            "  -m RATE     probability that a query base is substituted, 0..0.5 (default 0.05)\n"
            "  -s SEED     PRNG seed, an unsigned 64-bit integer (default 1)\n"
            "  -t THREADS  blastn -num_threads, 1..%ld (default 1)\n"
            "  -w DIR      work directory, kept afterwards (default: a fresh one under\n"
            "              $TMPDIR or /tmp, removed afterwards)\n",
            prog, MAX_SEQUENCES, MAX_LENGTH, MAX_QUERIES, MAX_THREADS);
}

static uint64_t splitmix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static double uniform(uint64_t *state)
{
    return (double)(splitmix64(state) >> 11) * 0x1.0p-53;
}

/* An unbiased integer in [0, bound). */
static long below(uint64_t *state, long bound)
{
    uint64_t limit = UINT64_MAX - UINT64_MAX % (uint64_t)bound;
    uint64_t x;
    do
        x = splitmix64(state);
    while (x >= limit);
    return (long)(x % (uint64_t)bound);
}

/* Writes through stdio and hashes exactly the bytes written. */
static int put(FILE *out, uint64_t *hash, const char *bytes, size_t length)
{
    *hash = fnv1a64(*hash, bytes, length);
    return fwrite(bytes, 1, length, out) == length ? 0 : -1;
}

static int put_sequence(FILE *out, uint64_t *hash, const char *header, const char *bases,
                        long length)
{
    if (put(out, hash, header, strlen(header)) != 0)
        return -1;
    for (long at = 0; at < length; at += LINE_WIDTH) {
        long width = length - at < LINE_WIDTH ? length - at : LINE_WIDTH;
        if (put(out, hash, bases + at, (size_t)width) != 0 || put(out, hash, "\n", 1) != 0)
            return -1;
    }
    return 0;
}

static char complement(char base)
{
    switch (base) {
    case 'A': return 'T';
    case 'C': return 'G';
    case 'G': return 'C';
    default: return 'A';
    }
}

static void cut_query(struct query *query, const char *sequence, long length)
{
    const char *from = sequence + query->offset;
    for (long n = 0; n < length; n++)
        query->bases[n] = query->minus ? complement(from[length - 1 - n]) : from[n];
}

static void mutate(char *bases, long length, double rate, uint64_t *state)
{
    static const char alphabet[] = "ACGT";
    for (long n = 0; n < length; n++) {
        if (uniform(state) >= rate)
            continue;
        int base = (int)(strchr(alphabet, bases[n]) - alphabet);
        bases[n] = alphabet[(base + 1 + below(state, 3)) % 4];
    }
}

/*
 * Writes db.fa and q.fa into dir. The PRNG draws in a fixed order (query plan, database,
 * mutations), so a seed names one database and one query set on every machine.
 */
static int generate(const struct options *opt, const char *dir, struct query *queries,
                    uint64_t *db_hash, uint64_t *query_hash)
{
    uint64_t state = opt->seed;
    char header[128];
    int status = -1;

    for (long q = 0; q < opt->queries; q++) {
        queries[q].source = below(&state, opt->sequences);
        queries[q].offset = below(&state, opt->length - opt->query_length + 1);
        queries[q].minus = (int)(splitmix64(&state) >> 63);
    }

    char *db_path = join(dir, "db.fa"), *query_path = join(dir, "q.fa");
    char *sequence = malloc((size_t)opt->length);
    FILE *db = db_path ? fopen(db_path, "w") : NULL;
    FILE *qf = query_path ? fopen(query_path, "w") : NULL;
    if (sequence == NULL || db == NULL || qf == NULL) {
        perror("blastgen: writing the database");
        goto done;
    }
    *db_hash = FNV1A64_OFFSET;
    for (long s = 0; s < opt->sequences; s++) {
        for (long n = 0; n < opt->length; n += 32) {
            uint64_t bits = splitmix64(&state);
            for (long k = n; k < n + 32 && k < opt->length; k++, bits >>= 2)
                sequence[k] = "ACGT"[bits & 3];
        }
        snprintf(header, sizeof header, ">s%ld synthetic sequence %ld\n", s, s);
        if (put_sequence(db, db_hash, header, sequence, opt->length) != 0) {
            perror("blastgen: writing db.fa");
            goto done;
        }
        for (long q = 0; q < opt->queries; q++)
            if (queries[q].source == s)
                cut_query(&queries[q], sequence, opt->query_length);
    }
    *query_hash = FNV1A64_OFFSET;
    for (long q = 0; q < opt->queries; q++) {
        mutate(queries[q].bases, opt->query_length, opt->mutation_rate, &state);
        snprintf(header, sizeof header, ">q%ld source=s%ld offset=%ld strand=%s\n", q,
                 queries[q].source, queries[q].offset, queries[q].minus ? "minus" : "plus");
        if (put_sequence(qf, query_hash, header, queries[q].bases, opt->query_length) != 0) {
            perror("blastgen: writing q.fa");
            goto done;
        }
    }
    status = 0;
done:
    if (db != NULL && fclose(db) != 0 && status == 0) {
        perror("blastgen: closing db.fa");
        status = -1;
    }
    if (qf != NULL && fclose(qf) != 0 && status == 0) {
        perror("blastgen: closing q.fa");
        status = -1;
    }
    free(sequence);
    free(db_path);
    free(query_path);
    return status;
}

static void copy_to_stderr(const char *path)
{
    FILE *in = fopen(path, "r");
    if (in == NULL)
        return;
    char buffer[4096];
    size_t got;
    while ((got = fread(buffer, 1, sizeof buffer, in)) > 0)
        fwrite(buffer, 1, got, stderr);
    fclose(in);
}

/*
 * Runs argv (found on PATH) in dir with its output in dir/log, and waits for it. Returns the
 * exit status, or -1 when it could not be run; *usage gets the child's own resource use.
 * The log is copied to stderr when the program fails, or always when `show_log` is set.
 */
static int run(char *const argv[], const char *dir, const char *log, int show_log,
               struct rusage *usage)
{
    fprintf(stderr, "blastgen: running");
    for (char *const *arg = argv; *arg != NULL; arg++)
        fprintf(stderr, " %s", *arg);
    fprintf(stderr, "\n");
    fflush(stdout);
    fflush(stderr);

    char *log_path = join(dir, log);
    if (log_path == NULL)
        return -1;
    pid_t pid = fork();
    if (pid < 0) {
        perror("blastgen: fork");
        free(log_path);
        return -1;
    }
    if (pid == 0) {
        int fd = open(log_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0 || chdir(dir) != 0 || dup2(fd, STDOUT_FILENO) < 0 || dup2(fd, STDERR_FILENO) < 0)
            _exit(126);
        execvp(argv[0], argv);
        fprintf(stderr, "blastgen: cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    int status;
    while (wait4(pid, &status, 0, usage) < 0) {
        if (errno != EINTR) {
            perror("blastgen: wait4");
            free(log_path);
            return -1;
        }
    }
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (code != 0 || show_log)
        copy_to_stderr(log_path);
    if (code != 0)
        fprintf(stderr, "blastgen: %s failed (status %d)%s\n", argv[0], code,
                code == 127 ? "; is ncbi-blast+ installed?" : "");
    free(log_path);
    return code;
}

/* The query number of "q17" (or of "q17 source=..."), or -1. */
static long query_number(const char *text)
{
    char *end;
    if (text[0] != 'q' || text[1] < '0' || text[1] > '9')
        return -1;
    long q = strtol(text + 1, &end, 10);
    return (*end == '\0' || *end == '\t' || *end == ' ' || *end == '\n') ? q : -1;
}

/*
 * Reads the outfmt 7 report: "# Query: qN ..." opens a query, "# H hits found" gives its hit
 * count, and the first tab-separated line after it is its top hit, "qN<TAB>sK<TAB>...".
 */
static int count_hits(const char *path, const struct query *queries, long count,
                      struct search_counts *out)
{
    FILE *in = fopen(path, "r");
    if (in == NULL) {
        perror("blastgen: reading result.txt");
        return -1;
    }
    char *line = NULL;
    size_t size = 0;
    long current = -1;
    int top_pending = 0;
    memset(out, 0, sizeof *out);
    snprintf(out->version, sizeof out->version, "unknown");
    while (getline(&line, &size, in) >= 0) {
        long hits;
        char version[48];
        if (sscanf(line, "# BLASTN %47s", version) == 1) {
            snprintf(out->version, sizeof out->version, "%s", version);
        } else if (strncmp(line, "# Query: ", 9) == 0) {
            current = query_number(line + 9);
            out->searched++;
            top_pending = 0;
        } else if (sscanf(line, "# %ld hits found", &hits) == 1) {
            out->hits += hits;
            top_pending = hits > 0;
        } else if (line[0] != '#' && line[0] != '\n') {
            out->lines++;
            char *tab = strchr(line, '\t');
            if (!top_pending || tab == NULL)
                continue;
            top_pending = 0;
            long q = query_number(line);
            if (q != current || q < 0 || q >= count)
                continue;
            char expected[32];
            int width = snprintf(expected, sizeof expected, "s%ld\t", queries[q].source);
            if (strncmp(tab + 1, expected, (size_t)width) == 0)
                out->self_hits++;
        }
    }
    free(line);
    fclose(in);
    return 0;
}

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    if (remove(path) != 0)
        perror(path);
    return 0;
}

static int parse_options(int argc, char **argv, struct options *opt)
{
    char *end;
    int c;
    while ((c = getopt(argc, argv, "n:L:q:l:m:s:t:w:")) != -1) {
        int bad = 0;
        switch (c) {
        case 'n': bad = !parse_long(optarg, 1, MAX_SEQUENCES, &opt->sequences); break;
        case 'L': bad = !parse_long(optarg, 1, MAX_LENGTH, &opt->length); break;
        case 'q': bad = !parse_long(optarg, 1, MAX_QUERIES, &opt->queries); break;
        case 'l': bad = !parse_long(optarg, 1, MAX_LENGTH, &opt->query_length); break;
        case 't': bad = !parse_long(optarg, 1, MAX_THREADS, &opt->threads); break;
        case 'w': opt->work_dir = optarg; break;
        case 'm':
            errno = 0;
            opt->mutation_rate = strtod(optarg, &end);
            bad = errno != 0 || end == optarg || *end != '\0' || !(opt->mutation_rate >= 0) ||
                  opt->mutation_rate > 0.5;
            break;
        case 's':
            errno = 0;
            opt->seed = strtoull(optarg, &end, 10);
            bad = errno != 0 || end == optarg || *end != '\0' || optarg[0] == '-';
            break;
        default: return -1;
        }
        if (bad)
            return -1;
    }
    return optind == argc && opt->query_length <= opt->length ? 0 : -1;
}

/* The work directory: the one given (created if missing), or a fresh temporary one. */
static char *make_work_dir(const char *given, int *temporary)
{
    *temporary = given == NULL;
    if (given != NULL) {
        if (mkdir(given, 0755) != 0 && errno != EEXIST) {
            perror(given);
            return NULL;
        }
        return strdup(given);
    }
    const char *tmp = getenv("TMPDIR");
    char *dir = join(tmp != NULL && tmp[0] != '\0' ? tmp : "/tmp", "virtlab-blast-XXXXXX");
    if (dir != NULL && mkdtemp(dir) == NULL) {
        perror("blastgen: mkdtemp");
        free(dir);
        return NULL;
    }
    return dir;
}

static int search(const struct options *opt, const char *dir, struct query *queries)
{
    uint64_t db_hash = 0, query_hash = 0;
    double t0 = now_s();
    if (generate(opt, dir, queries, &db_hash, &query_hash) != 0)
        return 1;
    double generate_s = now_s() - t0;

    struct rusage usage;
    char *makeblastdb[] = {"makeblastdb", "-dbtype", "nucl", "-in", "db.fa", "-out", "db", NULL};
    t0 = now_s();
    if (run(makeblastdb, dir, "makeblastdb.log", 0, &usage) != 0)
        return 1;
    double makeblastdb_s = now_s() - t0;

    char threads[32];
    snprintf(threads, sizeof threads, "%ld", opt->threads);
    char *blastn[] = {"blastn", "-query", "q.fa", "-db", "db", "-task", "blastn", "-dust", "no",
                      "-outfmt", "7", "-num_alignments", "2", "-num_descriptions", "2",
                      "-out", "result.txt", "-num_threads", threads, NULL};
    /* One thread is blastn's default; leave the option out then, as the seed did. */
    if (opt->threads == 1)
        blastn[17] = NULL;
    t0 = now_s();
    int code = run(blastn, dir, "blastn.log", 1, &usage);
    double elapsed_s = now_s() - t0;
    if (code != 0)
        return 1;

    struct search_counts counts;
    char *result = join(dir, "result.txt");
    int read = result != NULL ? count_hits(result, queries, opt->queries, &counts) : -1;
    free(result);
    if (read != 0)
        return 1;

    int valid = counts.searched == opt->queries && counts.self_hits == opt->queries &&
                counts.hits >= opt->queries && counts.lines == counts.hits;
    printf("queries=%ld searched=%ld hits=%ld self_hits=%ld elapsed_s=%.6f user_s=%.6f "
           "sys_s=%.6f makeblastdb_s=%.6f generate_s=%.6f db_sequences=%ld sequence_length=%ld "
           "db_letters=%lld query_length=%ld mutation_rate=%g seed=%llu threads=%ld "
           "db_fnv1a64=%016llx query_fnv1a64=%016llx blastn_version=%s valid=%d\n",
           opt->queries, counts.searched, counts.hits, counts.self_hits, elapsed_s,
           timeval_s(usage.ru_utime), timeval_s(usage.ru_stime), makeblastdb_s, generate_s,
           opt->sequences, opt->length, (long long)opt->sequences * opt->length,
           opt->query_length, opt->mutation_rate, (unsigned long long)opt->seed, opt->threads,
           (unsigned long long)db_hash, (unsigned long long)query_hash, counts.version, valid);
    return valid ? 0 : 1;
}

int main(int argc, char **argv)
{
    struct options opt = {2000, 5000, 1000, 1000, 1, 0.05, 1, NULL};
    if (parse_options(argc, argv, &opt) != 0) {
        usage(argv[0]);
        return 2;
    }
    struct query *queries = calloc((size_t)opt.queries, sizeof *queries);
    if (queries == NULL) {
        perror("blastgen");
        return 1;
    }
    for (long q = 0; q < opt.queries; q++)
        if ((queries[q].bases = malloc((size_t)opt.query_length)) == NULL) {
            perror("blastgen");
            return 1;
        }

    int temporary;
    char *dir = make_work_dir(opt.work_dir, &temporary);
    int status = dir != NULL ? search(&opt, dir, queries) : 1;
    if (dir != NULL && temporary)
        nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);

    for (long q = 0; q < opt.queries; q++)
        free(queries[q].bases);
    free(queries);
    free(dir);
    return status;
}
