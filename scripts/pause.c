/*
 * The pause image's one program (scripts/build-kube-images): the process
 * that holds a pod sandbox's namespaces while the pod's containers come and
 * go. It sleeps until SIGTERM or SIGINT and then exits 0; as PID 1 of the
 * sandbox it reaps every child that is handed to it.
 *
 * Built with `gcc -static -Os` and stripped: the image holds this file only.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static volatile sig_atomic_t stop_signal;

static void on_stop(int sig) { stop_signal = sig; }

/* SIGCHLD only has to end sigsuspend(); the main loop does the reaping. */
static void on_child(int sig) { (void)sig; }

static int handle(int sig, void (*fn)(int)) {
  struct sigaction sa;

  memset(&sa, 0, sizeof sa);
  sa.sa_handler = fn;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = sig == SIGCHLD ? SA_NOCLDSTOP : 0;
  return sigaction(sig, &sa, NULL);
}

static void reap(void) {
  for (;;) {
    pid_t pid = waitpid(-1, NULL, WNOHANG);
    if (pid > 0 || (pid < 0 && errno == EINTR))
      continue;
    return; /* 0: children left, all running; -1/ECHILD: none left */
  }
}

int main(int argc, char **argv) {
  sigset_t watched, during_wait;

  if (argc > 1) {
    fprintf(stderr, "usage: %s (no arguments): sleeps until SIGTERM or SIGINT\n", argv[0]);
    return 2;
  }
  /* The signals stay blocked except inside sigsuspend(), so that none can
   * arrive between the check of stop_signal and the wait (and be missed). */
  sigemptyset(&watched);
  sigaddset(&watched, SIGTERM);
  sigaddset(&watched, SIGINT);
  sigaddset(&watched, SIGCHLD);
  if (sigprocmask(SIG_BLOCK, &watched, &during_wait) != 0 || handle(SIGTERM, on_stop) != 0 ||
      handle(SIGINT, on_stop) != 0 || handle(SIGCHLD, on_child) != 0) {
    perror("pause: signal setup");
    return 1;
  }
  sigdelset(&during_wait, SIGTERM);
  sigdelset(&during_wait, SIGINT);
  sigdelset(&during_wait, SIGCHLD);

  while (!stop_signal) {
    sigsuspend(&during_wait); /* returns after a handler ran */
    reap();
  }
  return 0;
}
