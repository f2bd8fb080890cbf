// models/sha256.cpp: sha256_hex over OpenSSL's EVP digest.
#include "models/sha256.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>

#include <openssl/evp.h>

#include "common/error.h"

namespace tessera {

std::string sha256_hex(std::string_view prefix, const std::vector<std::string>& paths) {
  const std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), &EVP_MD_CTX_free);
  TESSERA_CHECK(ctx != nullptr && EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) == 1,
                "sha256: cannot start a digest");
  EVP_DigestUpdate(ctx.get(), prefix.data(), prefix.size());
  std::vector<char> buffer(1 << 20);
  for (const std::string& path : paths) {
    std::ifstream in(path, std::ios::binary);
    TESSERA_CHECK(in.good(), "sha256: cannot read " << path);
    while (in) {
      in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
      if (in.gcount() > 0) EVP_DigestUpdate(ctx.get(), buffer.data(), static_cast<size_t>(in.gcount()));
    }
    TESSERA_CHECK(in.eof(), "sha256: reading " << path << " failed before its end");
  }
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_DigestFinal_ex(ctx.get(), digest, &length);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < length; ++i) {
    out += kHex[digest[i] >> 4];
    out += kHex[digest[i] & 15];
  }
  return out;
}

std::string files_sha256(const std::vector<std::string>& paths) {
  std::string key;
  for (const std::string& path : paths) {
    std::error_code ec;
    const auto size = std::filesystem::file_size(path, ec);
    const auto modified = std::filesystem::last_write_time(path, ec).time_since_epoch().count();
    key += path + '\n' + std::to_string(size) + '\n' + std::to_string(modified) + '\n';
  }
  static std::mutex mutex;
  static std::map<std::string, std::string> known;
  {
    const std::lock_guard<std::mutex> lock(mutex);
    if (auto it = known.find(key); it != known.end()) return it->second;
  }
  std::string sha = sha256_hex("", paths);
  const std::lock_guard<std::mutex> lock(mutex);
  known[key] = sha;
  return sha;
}

}  // namespace tessera
