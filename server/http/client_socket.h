// server/http/client_socket.h: the accepted socket of the connection a request came on, to see a
// client that went away while its non-streamed response is still being computed.
//
// cpp-httplib 0.11 gives a handler no socket, and notices a closed connection only when it writes,
// which a non-streamed response does once, at the end: a client that timed out would otherwise keep
// its sequence decoding to max_tokens. The handler's connection is found among the process's
// sockets by the addresses httplib does report (no two open sockets share a local and a remote
// address), and stays open until the handler returns, so its descriptor cannot be reused meanwhile.
#pragma once

#include <string>

namespace tessera {

class ClientSocket {
 public:
  // The socket whose local port is local_port and whose peer is remote_addr:remote_port; one that
  // finds nothing reports closed() false forever.
  static ClientSocket find(const std::string& remote_addr, int remote_port, int local_port);

  bool found() const { return fd_ >= 0; }
  // The client closed or reset the connection. Does not block.
  bool closed() const;

 private:
  explicit ClientSocket(int fd) : fd_(fd) {}
  int fd_ = -1;
};

}  // namespace tessera
