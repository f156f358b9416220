/* The fault guard: a walk that reads memory it should not (a frame being torn down as it is
 * read) jumps back out instead of crashing the host.
 *
 * Every other SIGSEGV or SIGBUS goes to whatever handled it before: its handler is called as
 * the kernel would have (a runtime that recovers from its own faults, such as a JVM, goes on
 * working), or, where that was the default action, the default is put back and the faulting
 * instruction faults into it. The guard runs on the alternate signal stack when the thread has
 * one (a stack overflow is a SIGSEGV too). It stays installed for the life of the process,
 * inert between walks: a walk still running on another thread when the sampler stops must
 * stay guarded. The drain checks it is still installed (guard_is_ours) and the engine stops
 * sampling if someone replaced it.
 */
#include "native.h"

#include <errno.h>
#include <string.h>

__thread sigjmp_buf *guard_jump __attribute__((tls_model("initial-exec")));

static struct sigaction previous_segv, previous_bus;
static int installed_once;

static void on_fault(int signum, siginfo_t *info, void *context)
{
    sigjmp_buf *jump = guard_jump;
    if (jump != NULL && info->si_code > 0) { /* raised by the kernel, not sent by someone */
        guard_jump = NULL;
        siglongjmp(*jump, 1);
    }
    struct sigaction *previous = signum == SIGSEGV ? &previous_segv : &previous_bus;
    if ((previous->sa_flags & SA_SIGINFO) && previous->sa_sigaction != NULL) {
        previous->sa_sigaction(signum, info, context);
    } else if (!(previous->sa_flags & SA_SIGINFO) && previous->sa_handler != SIG_DFL &&
               previous->sa_handler != SIG_IGN) {
        previous->sa_handler(signum);
    } else {
        sigaction(signum, previous, NULL);
        if (info->si_code <= 0) {
            raise(signum); /* sent, so it will not come again by itself */
        }
    }
}

static int is_ours(int signum)
{
    struct sigaction current;
    return sigaction(signum, NULL, &current) == 0 && (current.sa_flags & SA_SIGINFO) &&
           current.sa_sigaction == on_fault;
}

int guard_is_ours(void)
{
    return is_ours(SIGSEGV) && is_ours(SIGBUS);
}

int guard_install(void)
{
    if (guard_is_ours()) {
        return 0;
    }
    if (installed_once) {
        /* Replaced since: installing again over a handler that may call ours as its previous
         * one would make a fault bounce between the two forever. */
        errno = EBUSY;
        return -1;
    }
    struct sigaction action;
    memset(&action, 0, sizeof(action));
    action.sa_sigaction = on_fault;
    action.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;
    sigemptyset(&action.sa_mask);
    if (!is_ours(SIGSEGV) && sigaction(SIGSEGV, &action, &previous_segv) != 0) {
        return -1;
    }
    if (!is_ours(SIGBUS) && sigaction(SIGBUS, &action, &previous_bus) != 0) {
        return -1;
    }
    installed_once = 1;
    return 0;
}

void guard_recovered(void)
{
    /* siglongjmp left the handler without sigreturn: unblock what the kernel blocked. */
    sigset_t faults;
    sigemptyset(&faults);
    sigaddset(&faults, SIGSEGV);
    sigaddset(&faults, SIGBUS);
    pthread_sigmask(SIG_UNBLOCK, &faults, NULL);
}
