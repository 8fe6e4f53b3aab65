// Finding a connection's socket by its address pair, and a non-blocking peek at it.
#include "serve/peer.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdlib>

namespace tessera::serve {

namespace {

// The port and printable address of a socket address (IPv4 or IPv6), or port -1.
int port_of(const sockaddr_storage& a, std::string* addr) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (a.ss_family == AF_INET) {
    const auto& in = reinterpret_cast<const sockaddr_in&>(a);
    if (addr) *addr = inet_ntop(AF_INET, &in.sin_addr, buf, sizeof buf) ? buf : "";
    return ntohs(in.sin_port);
  }
  if (a.ss_family == AF_INET6) {
    const auto& in = reinterpret_cast<const sockaddr_in6&>(a);
    if (addr) *addr = inet_ntop(AF_INET6, &in.sin6_addr, buf, sizeof buf) ? buf : "";
    return ntohs(in.sin6_port);
  }
  return -1;
}

}  // namespace

Peer::Peer(const std::string& remote_addr, int remote_port, int local_port) {
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return;
  while (const dirent* e = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0') continue;
    sockaddr_storage local{}, peer{};
    socklen_t n1 = sizeof local, n2 = sizeof peer;
    if (getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&local), &n1) != 0) continue;
    if (port_of(local, nullptr) != local_port) continue;
    if (getpeername(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&peer), &n2) != 0) continue;
    std::string addr;
    if (port_of(peer, &addr) == remote_port && addr == remote_addr) {
      fd_ = static_cast<int>(fd);
      break;
    }
  }
  closedir(dir);
}

bool Peer::gone() const {
  if (fd_ < 0) return false;
  char c;
  const ssize_t n = recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n > 0) return false;  // the client sent more (its next request): still there
  if (n == 0) return true;  // orderly end of stream
  return errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
}

}  // namespace tessera::serve
