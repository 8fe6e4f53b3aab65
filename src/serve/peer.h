// Whether the client of a request is still connected. cpp-httplib 0.11 (Debian 12) gives a
// handler no way to ask (later versions have Request::is_connection_closed), so the connection's
// socket is found among the process's open sockets by its address pair, once, and asked with a
// non-blocking peek: a clean end of stream or a reset means the client left.
#pragma once

#include <string>

namespace tessera::serve {

class Peer {
 public:
  // The connection from remote_addr:remote_port to our local_port.
  Peer(const std::string& remote_addr, int remote_port, int local_port);
  // True once the client has closed or reset the connection; false while it is open or when
  // the socket could not be found.
  bool gone() const;
  bool found() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

}  // namespace tessera::serve
