/* critest's `nonewprivs` image runs this setuid-root program as a non-root user and expects
 * "Effective uid: 0" when privilege escalation is allowed, the user's own uid when
 * `no_new_privs` forbids it. Built with `gcc -static`, installed mode 4755. */
#include <stdio.h>
#include <unistd.h>

int main(void) {
    printf("Effective uid: %d\n", (int)geteuid());
    return 0;
}
