/*
 * Minimal pod sandbox ("pause") process for the agentplane test cluster.
 * Built statically (gcc -static) by tests/cluster/image.sh and packed into
 * the OCI image localhost/agentplane/pause:dev, which containerd uses as its
 * sandbox_image so nothing is ever pulled. Behaves like the upstream pause:
 * PID 1 of the pod, reaps zombies, exits 0 on SIGINT/SIGTERM.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_term(int sig) {
	(void)sig;
	_exit(0);
}

static void on_chld(int sig) {
	(void)sig;
	while (waitpid(-1, NULL, WNOHANG) > 0) {
	}
}

int main(int argc, char **argv) {
	struct sigaction sa;
	if (argc > 1 && strcmp(argv[1], "-v") == 0) {
		puts("agentplane-pause 1");
		return 0;
	}
	if (getpid() != 1)
		fprintf(stderr, "pause: warning: not running as PID 1\n");
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_term;
	if (sigaction(SIGINT, &sa, NULL) < 0 || sigaction(SIGTERM, &sa, NULL) < 0)
		return 1;
	sa.sa_handler = on_chld;
	sa.sa_flags = SA_NOCLDSTOP;
	if (sigaction(SIGCHLD, &sa, NULL) < 0)
		return 2;
	for (;;)
		pause();
	return 42; /* unreachable */
}
