// models/tokenizer/sentencepiece_module.h: the entry point of libtessera_sentencepiece.so, the one
// piece of the tokenizers that uses libsentencepiece. Only models that ship a tokenizer.model and no
// tokenizer.json need it, so `tessera` does not link the library: it cost 1.0 MB of resident memory
// in every server, and Debian's build exports the protobuf-lite it bundles, whose symbols a binary
// with its own protobuf must keep apart. SentencePieceTokenizer (sentencepiece_tokenizer.cpp) opens
// the module on first use. Only standard types cross the boundary, and no exception does.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace tessera::tok {

// A loaded tokenizer.model: SentencePieceProcessor's calls that the tokenizer makes.
class SentencePieceModel {
 public:
  virtual ~SentencePieceModel() = default;
  virtual int piece_size() const = 0;
  virtual int bos_id() const = 0;
  virtual int eos_id() const = 0;
  virtual int unk_id() const = 0;
  virtual bool is_control(int id) const = 0;
  virtual bool is_byte(int id) const = 0;
  virtual const std::string& id_to_piece(int id) const = 0;
  virtual int piece_to_id(std::string_view piece) const = 0;
  // These two return false with the library's reason in `error`.
  virtual bool encode(std::string_view text, std::vector<int>* ids, std::string* error) const = 0;
  virtual bool decode(const std::vector<int>& ids, std::string* text, std::string* error) const = 0;
};

inline constexpr const char* kSentencePieceModuleName = "libtessera_sentencepiece.so";
inline constexpr const char* kSentencePieceEntryPoint = "tessera_sentencepiece_load";

}  // namespace tessera::tok

// Loads the model at `path`: returns it (the caller deletes it), or nullptr with the reason in `error`.
extern "C" tessera::tok::SentencePieceModel* tessera_sentencepiece_load(const char* path, std::string* error);
