/*
 * numa_move (seed 004's actuator, Table 2's Move_pages_socket and vcpu-pin, inside a guest): move
 * every present page of a process's private writable memory to one NUMA node with move_pages(2),
 * and restrict every thread of the process to that node's CPUs with sched_setaffinity(2).
 *
 * For guests whose image has no numactl: plain system calls, no libnuma. The pages are those of
 * the process's private writable mappings (anonymous memory, heap, stack, data), as numa_maps
 * counts them. Before and after the move each page's node is asked of the kernel (move_pages
 * with no target); the run is valid when every page the kernel reports present afterwards is on
 * the target node and every thread's affinity reads back as the node's CPUs. Pages that could
 * not move are counted by error (-EFAULT: a zero page or an unmapped address; busy or absent ones
 * are tried again, up to PASSES times; the kernel's automatic NUMA balancing, reported, makes
 * pages look absent while it samples them).
 *
 * Usage: numa_move -p PID -n NODE
 * Output: pid=... node=... cpus=... threads=... pinned=... pages=... before_on_node=... moved=...
 *         failed=... move_errors=-16:3,... after_on_node=... after_elsewhere=... after_errors=none
 *         numa_balancing=0 valid=1   (one line; errors as -errno:pages, "none" when none;
 *         numa_balancing: the kernel's automatic balancing, which moves pages too, -1 if unknown)
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "virtlab_kernel.h"

#define MPOL_MF_MOVE (1 << 1) /* <linux/mempolicy.h>: move pages owned by this process only */
#define CHUNK 4096            /* pages per move_pages call */
#define PASSES 10             /* tries for a page that was busy or absent */
#define PASS_PAUSE_US 20000   /* between two tries */

typedef struct {
    void **pages;
    size_t count, capacity;
} PageList;

#define MAX_ERRNO 256

/* "-EBUSY:12,-ENOMEM:3": how many pages ended with which error, "none" for none. */
static void format_errors(const long *tally, char *text, size_t size)
{
    size_t used = 0;
    text[0] = '\0';
    for (int e = 1; e < MAX_ERRNO; e++)
        if (tally[e] && used < size)
            used += (size_t)snprintf(text + used, size - used, "%s%d:%ld", used ? "," : "", -e, tally[e]);
    if (!used)
        snprintf(text, size, "none");
}

static void usage(const char *prog)
{
    fprintf(stderr,
            "usage: %s -p PID -n NODE\n"
            "  -p PID   the process whose memory and threads move\n"
            "  -n NODE  the NUMA node they move to\n",
            prog);
}

static int add_page(PageList *list, void *page)
{
    if (list->count == list->capacity) {
        size_t capacity = list->capacity ? 2 * list->capacity : 65536;
        void **grown = realloc(list->pages, capacity * sizeof *grown);
        if (grown == NULL)
            return -1;
        list->pages = grown;
        list->capacity = capacity;
    }
    list->pages[list->count++] = page;
    return 0;
}

/* Every page of the private writable mappings of pid (numa_maps' view of its own memory). */
static int collect_pages(long pid, PageList *list)
{
    char path[64], line[4096];
    snprintf(path, sizeof path, "/proc/%ld/maps", pid);
    FILE *maps = fopen(path, "r");
    if (maps == NULL)
        return -1;
    long page_size = sysconf(_SC_PAGESIZE);
    while (fgets(line, sizeof line, maps)) {
        uintptr_t start, end;
        char perms[5] = "";
        int name_at = 0;
        if (sscanf(line, "%lx-%lx %4s %*s %*s %*s %n", &start, &end, perms, &name_at) < 3)
            continue;
        const char *name = name_at ? line + name_at : "";
        if (perms[0] != 'r' || perms[1] != 'w' || perms[3] != 'p')
            continue;
        if (strncmp(name, "[vvar]", 6) == 0 || strncmp(name, "[vsyscall]", 10) == 0)
            continue;
        for (uintptr_t address = start; address < end; address += page_size)
            if (add_page(list, (void *)address) != 0) {
                fclose(maps);
                return -1;
            }
    }
    fclose(maps);
    return 0;
}

/* move_pages over the list in chunks; nodes == NULL only asks where each page is. */
static int move_chunks(long pid, PageList *list, const int *nodes, int *status)
{
    for (size_t first = 0; first < list->count; first += CHUNK) {
        size_t n = list->count - first < CHUNK ? list->count - first : CHUNK;
        long done = syscall(SYS_move_pages, pid, n, list->pages + first, nodes ? nodes + first : NULL,
                            status + first, nodes ? MPOL_MF_MOVE : 0);
        if (done < 0)
            return -1;
    }
    return 0;
}

static int read_cpulist(long node, cpu_set_t *set, char *text, size_t size)
{
    char path[96];
    snprintf(path, sizeof path, "/sys/devices/system/node/node%ld/cpulist", node);
    FILE *file = fopen(path, "r");
    if (file == NULL || fgets(text, (int)size, file) == NULL) {
        if (file)
            fclose(file);
        return -1;
    }
    fclose(file);
    text[strcspn(text, "\n")] = '\0';
    CPU_ZERO(set);
    for (char *part = text; *part;) {
        char *end;
        long first = strtol(part, &end, 10), last = first;
        if (end == part)
            return -1;
        if (*end == '-')
            last = strtol(end + 1, &end, 10);
        for (long cpu = first; cpu <= last && cpu < CPU_SETSIZE; cpu++)
            CPU_SET(cpu, set);
        part = *end == ',' ? end + 1 : end;
    }
    return CPU_COUNT(set) > 0 ? 0 : -1;
}

/* Pin every thread of pid to the set; returns how many were pinned and read back equal, or -1. */
static int pin_threads(long pid, const cpu_set_t *set, int *threads)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%ld/task", pid);
    DIR *tasks = opendir(path);
    if (tasks == NULL)
        return -1;
    int agreed = 0;
    *threads = 0;
    for (struct dirent *entry; (entry = readdir(tasks)) != NULL;) {
        long tid;
        if (!parse_long(entry->d_name, 1, 1L << 30, &tid))
            continue;
        cpu_set_t seen;
        (*threads)++;
        if (sched_setaffinity((pid_t)tid, sizeof *set, set) == 0 &&
            sched_getaffinity((pid_t)tid, sizeof seen, &seen) == 0 && CPU_EQUAL(&seen, set))
            agreed++;
    }
    closedir(tasks);
    return agreed;
}

int main(int argc, char **argv)
{
    long pid = -1, node = -1;
    const KernelOption options[] = {
        {'p', 1, 1L << 30, &pid, NULL},
        {'n', 0, 1023, &node, NULL},
    };
    if (!parse_kernel_options(argc, argv, options, COUNT_OF(options)) || pid < 0 || node < 0) {
        usage(argv[0]);
        return 2;
    }

    cpu_set_t cpus;
    char cpulist[256];
    if (read_cpulist(node, &cpus, cpulist, sizeof cpulist) != 0) {
        fprintf(stderr, "numa_move: node %ld has no CPUs listed in /sys/devices/system/node\n", node);
        return 2;
    }
    PageList list = {0};
    if (collect_pages(pid, &list) != 0) {
        fprintf(stderr, "numa_move: reading the mappings of process %ld: %s\n", pid, strerror(errno));
        return 1;
    }
    int *status = malloc((list.count + 1) * sizeof *status);
    int *nodes = malloc((list.count + 1) * sizeof *nodes);
    if (status == NULL || nodes == NULL) {
        fprintf(stderr, "numa_move: out of memory for %zu pages\n", list.count);
        return 1;
    }

    /* Threads first: what they touch from now on is allocated on the node's memory. */
    int threads = 0;
    int pinned = pin_threads(pid, &cpus, &threads);

    /* Where the pages are now: present pages away from the node are the ones to move. */
    if (move_chunks(pid, &list, NULL, status) != 0) {
        fprintf(stderr, "numa_move: move_pages(%ld, query): %s\n", pid, strerror(errno));
        return 1;
    }
    PageList away = {0};
    long present = 0, before_on_node = 0;
    for (size_t i = 0; i < list.count; i++) {
        if (status[i] < 0)
            continue; /* -ENOENT: not present, nothing to move */
        present++;
        if (status[i] == node)
            before_on_node++;
        else if (add_page(&away, list.pages[i]) != 0)
            return 1;
    }
    for (size_t i = 0; i < away.count; i++)
        nodes[i] = (int)node;
    /* A page may be busy when asked to move (the process writes it), or look absent (-ENOENT) for a
     * moment: the kernel's own NUMA balancing unmaps pages to sample their accesses until the next
     * touch. Such pages get further passes, a short pause apart; -EFAULT (a zero page, an unmapped
     * address) is final. */
    long moved = 0, failed = 0, move_errors[MAX_ERRNO] = {0}, after_errors[MAX_ERRNO] = {0};
    int passes = 0;
    while (away.count && passes < PASSES) {
        passes++;
        if (move_chunks(pid, &away, nodes, status) != 0) {
            fprintf(stderr, "numa_move: move_pages(%ld -> node %ld): %s\n", pid, node, strerror(errno));
            return 1;
        }
        size_t again = 0;
        for (size_t i = 0; i < away.count; i++) {
            if (status[i] == node)
                moved++;
            else if (status[i] < 0 && status[i] != -EFAULT && passes < PASSES)
                away.pages[again++] = away.pages[i];
            else {
                failed++;
                if (status[i] < 0 && -status[i] < MAX_ERRNO)
                    move_errors[-status[i]]++;
            }
        }
        away.count = again;
        if (again)
            usleep(PASS_PAUSE_US);
    }

    /* Read every page's node back from the kernel. */
    long after_on_node = 0, after_elsewhere = 0;
    if (move_chunks(pid, &list, NULL, status) != 0) {
        fprintf(stderr, "numa_move: move_pages(%ld, query after): %s\n", pid, strerror(errno));
        return 1;
    }
    for (size_t i = 0; i < list.count; i++) {
        if (status[i] == node)
            after_on_node++;
        else if (status[i] >= 0)
            after_elsewhere++;
        else if (-status[i] < MAX_ERRNO)
            after_errors[-status[i]]++;
    }
    char move_text[256], after_text[256];
    format_errors(move_errors, move_text, sizeof move_text);
    format_errors(after_errors, after_text, sizeof after_text);
    int valid = after_elsewhere == 0 && pinned == threads && threads > 0;
    int balancing = -1;
    FILE *sysctl = fopen("/proc/sys/kernel/numa_balancing", "r");
    if (sysctl) {
        if (fscanf(sysctl, "%d", &balancing) != 1)
            balancing = -1;
        fclose(sysctl);
    }
    printf("pid=%ld node=%ld cpus=%s threads=%d pinned=%d pages=%ld before_on_node=%ld moved=%ld failed=%ld "
           "move_errors=%s after_on_node=%ld after_elsewhere=%ld after_errors=%s numa_balancing=%d valid=%d\n",
           pid, node, cpulist, threads, pinned, present, before_on_node, moved, failed, move_text, after_on_node,
           after_elsewhere, after_text, balancing, valid);
    free(list.pages);
    free(away.pages);
    free(status);
    free(nodes);
    return valid ? 0 : 1;
}
