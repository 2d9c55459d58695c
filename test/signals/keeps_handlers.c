/* Loading a shared object keeps the program's signal handlers: installs its own handlers for
 * SIGINT, SIGTERM, SIGSEGV and SIGABRT, notes every disposition, dlopen()s each object named on
 * the command line (the library, the Redis/Valkey module) and exits 1, naming the signal and the
 * object whose handler replaced it, if any disposition changed.
 *   keeps-handlers OBJECT.so...
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

static void handler(int signal) { (void)signal; }

/* The handler's address, copied as bytes: ISO C has no cast from a function pointer to void *. */
static void* handler_of(const struct sigaction* action) {
  void* address = NULL;
  if (action->sa_flags & SA_SIGINFO)
    memcpy(&address, &action->sa_sigaction, sizeof address);
  else
    memcpy(&address, &action->sa_handler, sizeof address);
  return address;
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: keeps-handlers OBJECT.so...\n");
    return 2;
  }
  const int own[] = {SIGINT, SIGTERM, SIGSEGV, SIGABRT};
  struct sigaction mine;
  memset(&mine, 0, sizeof mine);
  mine.sa_handler = handler;
  sigemptyset(&mine.sa_mask);
  for (size_t i = 0; i < sizeof own / sizeof own[0]; ++i) {
    if (sigaction(own[i], &mine, NULL) != 0) {
      perror("sigaction");
      return 2;
    }
  }
  static struct sigaction before[NSIG];
  static int known[NSIG];
  for (int s = 1; s < NSIG; ++s)
    known[s] = sigaction(s, NULL, &before[s]) == 0;

  int changed = 0;
  for (int a = 1; a < argc; ++a) {
    void* object = dlopen(argv[a], RTLD_NOW | RTLD_LOCAL);
    if (object == NULL) {
      fprintf(stderr, "dlopen %s: %s\n", argv[a], dlerror());
      return 2;
    }
    for (int s = 1; s < NSIG; ++s) {
      struct sigaction now;
      if (!known[s] || sigaction(s, NULL, &now) != 0) continue;
      /* SA_RESTORER (0x04000000) reads back on any disposition the C library set. */
      if (handler_of(&now) == handler_of(&before[s]) && ((now.sa_flags ^ before[s].sa_flags) & ~0x04000000) == 0)
        continue;
      Dl_info info;
      memset(&info, 0, sizeof info);
      const char* by = dladdr(handler_of(&now), &info) && info.dli_fname ? info.dli_fname : "(no object)";
      printf("loading %s changed the handler of signal %d (%s) to one in %s\n", argv[a], s, strsignal(s), by);
      ++changed;
    }
    if (changed == 0) printf("%s: every signal disposition kept\n", argv[a]);
  }
  return changed == 0 ? 0 : 1;
}
