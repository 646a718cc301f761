// JSON text helpers shared by the modules that write JSON by hand (chat prompts must match Python's
// json.dumps byte for byte; grammars spell out the literal strings they accept).
#pragma once

#include <string>
#include <string_view>

namespace deepinfer {

// Appends `utf8` as a quoted JSON string the way Python's json.dumps(ensure_ascii=False) writes it:
// ", \ and the control characters escaped (\n \r \t \b \f, others as \u00XX), everything else verbatim.
void append_json_string(std::string& out, std::string_view utf8);

}  // namespace deepinfer
