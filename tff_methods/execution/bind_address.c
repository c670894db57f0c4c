// Binds what a program binds to the any-address (0.0.0.0 or [::]) to
// TFF_METHODS_BIND_HOST instead, when preloaded (`tff_methods.execution.bind_address`):
// TFF's worker_binary fixes its address at [::] and has no host flag.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

typedef int (*bind_fn)(int, const struct sockaddr *, socklen_t);

int bind(int fd, const struct sockaddr *addr, socklen_t len) {
  static bind_fn real_bind;
  if (!real_bind) real_bind = (bind_fn)dlsym(RTLD_NEXT, "bind");
  const char *host = getenv("TFF_METHODS_BIND_HOST");
  if (host == NULL || addr == NULL) return real_bind(fd, addr, len);
  struct in_addr v4;
  struct in6_addr v6;
  int is_v4 = inet_pton(AF_INET, host, &v4) == 1;
  int is_v6 = !is_v4 && inet_pton(AF_INET6, host, &v6) == 1;
  if (addr->sa_family == AF_INET6 && len >= sizeof(struct sockaddr_in6)) {
    struct sockaddr_in6 a;
    memcpy(&a, addr, sizeof a);
    if (!IN6_IS_ADDR_UNSPECIFIED(&a.sin6_addr)) return real_bind(fd, addr, len);
    if (is_v6) {
      a.sin6_addr = v6;
    } else if (is_v4) {  // An IPv4-mapped address: IPv4 clients only.
      memset(&a.sin6_addr, 0, sizeof a.sin6_addr);
      a.sin6_addr.s6_addr[10] = 0xff;
      a.sin6_addr.s6_addr[11] = 0xff;
      memcpy(&a.sin6_addr.s6_addr[12], &v4, 4);
    } else {
      return real_bind(fd, addr, len);
    }
    return real_bind(fd, (const struct sockaddr *)&a, sizeof a);
  }
  if (addr->sa_family == AF_INET && len >= sizeof(struct sockaddr_in)) {
    struct sockaddr_in a;
    memcpy(&a, addr, sizeof a);
    if (a.sin_addr.s_addr != htonl(INADDR_ANY) || !is_v4) {
      return real_bind(fd, addr, len);
    }
    a.sin_addr = v4;
    return real_bind(fd, (const struct sockaddr *)&a, sizeof a);
  }
  return real_bind(fd, addr, len);
}
