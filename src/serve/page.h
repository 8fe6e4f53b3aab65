// The web page served at / (src/serve/page/index.html: a chat and a live dashboard of the
// server's metrics), embedded in the binary at build time.
#pragma once

#include <string_view>

namespace tessera::serve {

std::string_view page_html();

}  // namespace tessera::serve
