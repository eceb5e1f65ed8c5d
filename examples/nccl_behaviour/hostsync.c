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
 * MTPDIAG_SPIN_NICE=N: a thread's first host_wait_spin that has to wait lowers the thread to nice N, once its
 * rank has started; it still spins, runnable, and burns every cycle nothing else wants. For a shared test
 * machine, where spinning ranks at normal priority starve everything beside them (on a user's node each rank
 * has a core of its own); starting the whole job at nice N instead slows its start-up too.
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

static _Thread_local int spin_niced;

static void nice_spinner(void) {
    if (spin_niced) return;
    spin_niced = 1;
    const char *nice = getenv("MTPDIAG_SPIN_NICE");
    if (nice != NULL && *nice != '\0') setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), atoi(nice));
}

void host_wait_spin(void *unused) {
    (void)unused;
    uint32_t target = atomic_load(&issued);
    if (!reached(atomic_load(&completed), target)) nice_spinner();
    while (!reached(atomic_load(&completed), target)) cpu_relax();
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
