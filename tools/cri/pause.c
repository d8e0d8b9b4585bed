/* The sandbox ("pause") container of tools/check-pods.sh: holds the pod's namespaces, reaps
 * orphans, exits on SIGINT/SIGTERM. Built statically into a one-file image by check-pods.sh,
 * since nothing can be pulled there. */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_term(int sig) { (void)sig; _exit(0); }
static void on_child(int sig) {
  (void)sig;
  while (waitpid(-1, NULL, WNOHANG) > 0) {}
}

int main(void) {
  struct sigaction term = {0}, child = {0};
  term.sa_handler = on_term;
  child.sa_handler = on_child;
  child.sa_flags = SA_NOCLDSTOP;
  sigaction(SIGINT, &term, NULL);
  sigaction(SIGTERM, &term, NULL);
  sigaction(SIGCHLD, &child, NULL);
  for (;;) pause();
}
