// server/http/client_socket.cpp
#include "server/http/client_socket.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <cstdlib>

namespace tessera {
namespace {

// The port and numeric address of a socket address (IPv4 or IPv6); port -1 for other families.
int port_and_address(const sockaddr_storage& a, std::string* address) {
  char text[INET6_ADDRSTRLEN] = {};
  if (a.ss_family == AF_INET) {
    const auto& v4 = reinterpret_cast<const sockaddr_in&>(a);
    if (address) address->assign(inet_ntop(AF_INET, &v4.sin_addr, text, sizeof(text)) ? text : "");
    return ntohs(v4.sin_port);
  }
  if (a.ss_family == AF_INET6) {
    const auto& v6 = reinterpret_cast<const sockaddr_in6&>(a);
    if (address) address->assign(inet_ntop(AF_INET6, &v6.sin6_addr, text, sizeof(text)) ? text : "");
    return ntohs(v6.sin6_port);
  }
  return -1;
}

bool matches(int fd, const std::string& remote_addr, int remote_port, int local_port) {
  sockaddr_storage a{};
  socklen_t size = sizeof(a);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &size) != 0) return false;  // not a socket
  if (port_and_address(a, nullptr) != local_port) return false;
  size = sizeof(a);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&a), &size) != 0) return false;  // a listening socket
  std::string address;
  return port_and_address(a, &address) == remote_port && address == remote_addr;
}

}  // namespace

ClientSocket ClientSocket::find(const std::string& remote_addr, int remote_port, int local_port) {
  if (remote_port <= 0 || local_port <= 0) return ClientSocket(-1);
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return ClientSocket(-1);
  const int own = ::dirfd(dir);
  int found = -1;
  while (const dirent* entry = ::readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0' || fd == own) continue;
    if (matches(static_cast<int>(fd), remote_addr, remote_port, local_port)) {
      found = static_cast<int>(fd);
      break;
    }
  }
  ::closedir(dir);
  return ClientSocket(found);
}

bool ClientSocket::closed() const {
  if (fd_ < 0) return false;
  // POLLRDHUP: the peer shut its side (FIN); POLLHUP / POLLERR: reset. Unread bytes alone (a
  // pipelined next request) are not a close.
  pollfd p{fd_, POLLIN | POLLRDHUP, 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  return (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

}  // namespace tessera
