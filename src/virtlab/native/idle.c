/*
 * idle: the idle member of a consolidation tile (seed 001's vServCon tile has an idle VM). It does
 * nothing for D seconds but wake every I milliseconds, and reports what an idle environment costs
 * and how it fares, as far as it can be seen from inside:
 *
 *   busy_s / busy_pct   non-idle CPU time of every CPU in /proc/stat (user, nice, system, irq,
 *                       softirq) over the idle period. Its scope is the kernel this program runs
 *                       on: in a VM the guest's own CPUs (its timer ticks, daemons); natively and
 *                       in a container the host's, neighbours included (/proc/stat is not
 *                       namespaced), where cgroup_cpu_s is the container's own figure.
 *   steal_s / steal_pct time the hypervisor gave the CPUs to someone else (a VM's view).
 *   cgroup_cpu_s        CPU time charged to this program's cgroup (cpuacct.usage in v1, cpu.stat
 *                       usage_usec in v2): a container's whole cost; the root cgroup ("/") is the
 *                       whole machine. cgroup=- when no cgroup CPU accounting is readable.
 *   late_*_us           how late the periodic wake-ups come (the timer's slack, the scheduler and,
 *                       in a VM, the hypervisor's delay in running an idle vCPU again).
 *   self_cpu_s          this program's own CPU time, so that its share of the above is known.
 *
 * valid=1 when the whole period was slept through, every wake-up was counted and /proc/stat was
 * read at both ends.
 *
 * Usage: idle [-d SECONDS] [-i MILLISECONDS]   (-i 0: one sleep, no wake-ups measured)
 * Output: one line of key=value pairs.
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#define MAX_WAKES 1000000L

typedef struct {
    unsigned long long busy, idle, steal; /* clock ticks */
    int cpus;
} CpuTimes;

static void usage(const char *prog)
{
    fprintf(stderr,
            "usage: %s [-d SECONDS] [-i MILLISECONDS]\n"
            "  -d SECONDS       how long to idle, > 0 (default 60)\n"
            "  -i MILLISECONDS  wake-up period for the lateness figures, 0 = none (default 100)\n",
            prog);
}

static long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* The aggregate "cpu" line of /proc/stat and the number of "cpuN" lines it sums. */
static int read_cpu_times(CpuTimes *out)
{
    FILE *file = fopen("/proc/stat", "r");
    if (file == NULL)
        return 0;
    char line[512];
    int found = 0;
    memset(out, 0, sizeof *out);
    while (fgets(line, sizeof line, file) != NULL) {
        unsigned long long v[8] = {0};
        if (strncmp(line, "cpu ", 4) == 0) {
            /* user nice system idle iowait irq softirq steal (guest time is inside user/nice) */
            if (sscanf(line + 4, "%llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3],
                       &v[4], &v[5], &v[6], &v[7]) < 4)
                break;
            out->busy = v[0] + v[1] + v[2] + v[5] + v[6];
            out->idle = v[3] + v[4];
            out->steal = v[7];
            found = 1;
        } else if (strncmp(line, "cpu", 3) == 0 && line[3] >= '0' && line[3] <= '9') {
            out->cpus++;
        }
    }
    fclose(file);
    return found;
}

/* Reads the first number after `key` (or the first number of the file when key is NULL). */
static int read_number(const char *path, const char *key, unsigned long long *value)
{
    FILE *file = fopen(path, "r");
    if (file == NULL)
        return 0;
    char line[256];
    int found = 0;
    while (!found && fgets(line, sizeof line, file) != NULL) {
        size_t length = key ? strlen(key) : 0;
        if (key && !(strncmp(line, key, length) == 0 && line[length] == ' '))
            continue;
        found = sscanf(line + length, "%llu", value) == 1;
    }
    fclose(file);
    return found;
}

/*
 * Where this program's cgroup CPU usage is readable, from /proc/self/cgroup. A container's
 * /sys/fs/cgroup shows its own cgroup at each hierarchy's root, a host the whole tree; both are
 * tried. Returns the file and sets *nanoseconds_per_unit; NULL when there is none.
 */
static const char *cgroup_usage_file(char *path, size_t size, char *group, size_t group_size, long *unit_ns)
{
    FILE *file = fopen("/proc/self/cgroup", "r");
    if (file == NULL)
        return NULL;
    char line[1024];
    const char *result = NULL;
    while (result == NULL && fgets(line, sizeof line, file) != NULL) {
        line[strcspn(line, "\n")] = '\0';
        char *controllers = strchr(line, ':');
        char *where = controllers ? strchr(controllers + 1, ':') : NULL;
        if (where == NULL)
            continue;
        *where++ = '\0';
        controllers++;
        int v2 = controllers[0] == '\0';
        char list[256];
        snprintf(list, sizeof list, ",%s,", controllers);
        if (!v2 && strstr(list, ",cpuacct,") == NULL)
            continue;
        const char *name = v2 ? "cpu.stat" : "cpuacct.usage";
        const char *prefix = v2 ? "/sys/fs/cgroup" : NULL;
        char base[300];
        if (prefix == NULL)
            snprintf(base, sizeof base, "/sys/fs/cgroup/%s", controllers);
        else
            snprintf(base, sizeof base, "%s", prefix);
        const char *candidates[2] = {where, "/"};
        for (int i = 0; i < 2 && result == NULL; i++) {
            snprintf(path, size, "%s%s%s/%s", base, candidates[i][0] == '/' ? "" : "/",
                     strcmp(candidates[i], "/") == 0 ? "" : candidates[i], name);
            unsigned long long probe;
            if (read_number(path, v2 ? "usage_usec" : NULL, &probe)) {
                snprintf(group, group_size, "%s", where);
                *unit_ns = v2 ? 1000 : 1;
                result = path;
            }
        }
    }
    fclose(file);
    return result;
}

static int compare_ll(const void *a, const void *b)
{
    long long x = *(const long long *)a, y = *(const long long *)b;
    return (x > y) - (x < y);
}

static double self_cpu_s(void)
{
    struct rusage usage;
    getrusage(RUSAGE_SELF, &usage);
    return (double)(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
           (double)(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) * 1e-6;
}

static int sleep_until(long long deadline_ns)
{
    struct timespec ts = {deadline_ns / 1000000000LL, deadline_ns % 1000000000LL};
    int error;
    while ((error = clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL)) == EINTR)
        ;
    return error == 0;
}

int main(int argc, char **argv)
{
    double duration_s = 60.0;
    long interval_ms = 100;
    int opt;
    char *end;
    while ((opt = getopt(argc, argv, "d:i:")) != -1) {
        switch (opt) {
        case 'd':
            duration_s = strtod(optarg, &end);
            if (*end != '\0' || !(duration_s > 0) || duration_s > 1e7) {
                usage(argv[0]);
                return 2;
            }
            break;
        case 'i':
            interval_ms = strtol(optarg, &end, 10);
            if (*end != '\0' || interval_ms < 0 || interval_ms > 3600000) {
                usage(argv[0]);
                return 2;
            }
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
    long long period_ns = (long long)interval_ms * 1000000LL;
    long long duration_ns = (long long)(duration_s * 1e9);
    long expected = period_ns > 0 ? (long)(duration_ns / period_ns) : 0;
    if (expected > MAX_WAKES) {
        fprintf(stderr, "idle: %ld wake-ups exceed %ld; give a longer -i\n", expected, MAX_WAKES);
        return 2;
    }
    long long *late = calloc((size_t)expected + 1, sizeof *late);
    if (late == NULL) {
        perror("idle");
        return 1;
    }

    char cgroup_path[1400], group[1024] = "-";
    long unit_ns = 1;
    const char *usage_file = cgroup_usage_file(cgroup_path, sizeof cgroup_path, group, sizeof group, &unit_ns);
    unsigned long long cgroup_before = 0, cgroup_after = 0;
    int cgroup_ok = usage_file && read_number(usage_file, unit_ns == 1 ? NULL : "usage_usec", &cgroup_before);
    CpuTimes before, after;
    int stat_ok = read_cpu_times(&before);
    long long start = now_ns();

    long wakes = 0;
    int slept = 1;
    for (long k = 1; k <= expected; k++) {
        long long deadline = start + k * period_ns;
        slept &= sleep_until(deadline);
        late[wakes++] = now_ns() - deadline;
    }
    slept &= sleep_until(start + duration_ns);

    long long elapsed_ns = now_ns() - start;
    stat_ok &= read_cpu_times(&after);
    cgroup_ok = cgroup_ok && read_number(usage_file, unit_ns == 1 ? NULL : "usage_usec", &cgroup_after);

    long ticks = sysconf(_SC_CLK_TCK);
    double busy_s = (double)(after.busy - before.busy) / (double)ticks;
    double steal_s = (double)(after.steal - before.steal) / (double)ticks;
    double idle_s = (double)(after.idle - before.idle) / (double)ticks;
    double all_s = busy_s + steal_s + idle_s;
    printf("duration_s=%.3f elapsed_s=%.6f interval_ms=%ld cpus=%d busy_s=%.2f steal_s=%.2f idle_s=%.2f "
           "busy_pct=%.4f steal_pct=%.4f",
           duration_s, (double)elapsed_ns * 1e-9, interval_ms, after.cpus, busy_s, steal_s, idle_s,
           all_s > 0 ? 100.0 * busy_s / all_s : 0.0, all_s > 0 ? 100.0 * steal_s / all_s : 0.0);
    if (cgroup_ok)
        printf(" cgroup=%s cgroup_cpu_s=%.6f", group,
               (double)(cgroup_after - cgroup_before) * (double)unit_ns * 1e-9);
    else
        printf(" cgroup=-");
    printf(" wakes=%ld", wakes);
    if (wakes > 0) {
        double sum = 0;
        for (long i = 0; i < wakes; i++)
            sum += (double)late[i];
        qsort(late, (size_t)wakes, sizeof *late, compare_ll);
        long p99 = (long)((double)(wakes - 1) * 0.99 + 0.5);
        printf(" late_median_us=%.1f late_p99_us=%.1f late_max_us=%.1f late_mean_us=%.1f",
               (double)late[(wakes - 1) / 2] * 1e-3, (double)late[p99] * 1e-3, (double)late[wakes - 1] * 1e-3,
               sum / (double)wakes * 1e-3);
    }
    printf(" self_cpu_s=%.6f valid=%d\n", self_cpu_s(),
           slept && stat_ok && wakes == expected && elapsed_ns >= duration_ns);
    free(late);
    return 0;
}
