/* Host-side waits for the emulated device stream of examples/nccl_behaviour.
 *
 * The "device" is a Python thread (device.py) that runs the collectives and kernels the host queued,
 * in order, and calls stream_complete() after each one. A host sync (.cpu(), .item(), .tolist() of a
 * device tensor) calls one of the host_wait_* functions below through ctypes: it returns once every
 * item issued before the call has completed. Being C, the wait leaves no Python frame of its own, so
 * py-spy shows the Python line that issued the sync as the innermost frame, as in a real NCCL hang.
 *
 * The three ways to wait match CUDA's device schedule flags:
 *   host_wait_spin   busy-wait, 100% of a core (cudaDeviceScheduleSpin, the default for few contexts)
 *   host_wait_poll   check every millisecond, sleeping in between (a yield/poll loop)
 *   host_wait_futex  sleep in the kernel until woken (cudaDeviceScheduleBlockingSync)
 *
 * The object argument is not touched: ctypes passes it so that its errcheck hook can return it.
 *
 * MTPDIAG_SPIN_NICE=N: a host_wait_spin that has spun for a second lowers its thread to nice N, for good: a hung
 * rank still spins, runnable, and burns every cycle nothing else wants, while a healthy step's short waits, and
 * the rank's start-up, keep its own priority. For a shared test machine, where spinning ranks at normal priority
 * starve everything beside them (on a user's node each rank has a core of its own).
 */
#include <limits.h>
#include <linux/futex.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static _Atomic uint32_t issued;
static _Atomic uint32_t completed;

/* Called by the host when it queues an item on the stream; returns the item's ticket. */
uint32_t stream_issue(void) { return atomic_fetch_add(&issued, 1) + 1; }

/* Called by the device thread after an item has run. */
void stream_complete(void) {
    atomic_fetch_add(&completed, 1);
    syscall(SYS_futex, &completed, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

uint32_t stream_issued(void) { return atomic_load(&issued); }
uint32_t stream_completed(void) { return atomic_load(&completed); }

static int reached(uint32_t done, uint32_t target) { return (int32_t)(done - target) >= 0; }

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static _Thread_local int spin_nice = -1;  /* the nice to take after a second of spinning; -1: not read yet */

static int spin_nice_wanted(void) {
    if (spin_nice == -1) {
        const char *nice = getenv("MTPDIAG_SPIN_NICE");
        spin_nice = (nice != NULL && *nice != '\0') ? atoi(nice) : 0;
    }
    return spin_nice;
}

static double seconds_since(const struct timespec *start) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)(now.tv_sec - start->tv_sec) + (double)(now.tv_nsec - start->tv_nsec) / 1e9;
}

void host_wait_spin(void *unused) {
    (void)unused;
    uint32_t target = atomic_load(&issued);
    if (spin_nice_wanted() <= 0) {
        while (!reached(atomic_load(&completed), target)) cpu_relax();
        return;
    }
    struct timespec start;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (uint32_t spins = 1; !reached(atomic_load(&completed), target); spins++) {
        cpu_relax();
        if ((spins & 0xFFFF) == 0 && spin_nice > 0 && seconds_since(&start) >= 1.0) {
            setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), spin_nice);
            spin_nice = -2;  /* done: this thread stays at it */
        }
    }
}

void host_wait_poll(void *unused) {
    (void)unused;
    const struct timespec one_ms = {0, 1000000};
    uint32_t target = atomic_load(&issued);
    while (!reached(atomic_load(&completed), target)) nanosleep(&one_ms, NULL);
}

void host_wait_futex(void *unused) {
    (void)unused;
    uint32_t target = atomic_load(&issued);
    for (;;) {
        uint32_t seen = atomic_load(&completed);
        if (reached(seen, target)) return;
        syscall(SYS_futex, &completed, FUTEX_WAIT_PRIVATE, seen, NULL, NULL, 0);
    }
}
