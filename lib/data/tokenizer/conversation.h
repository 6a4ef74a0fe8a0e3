// A conversation as datasets carry it: alternating user and assistant turns. Shared by the
// manifest readers (which produce it) and the chat template (which tokenizes it).
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace vlm::data {

enum class ChatRole { kUser, kAssistant };

// "user" / "assistant" -> the role; nullopt for anything else.
std::optional<ChatRole> parse_chat_role(std::string_view name);

struct ChatTurn {
  ChatRole role = ChatRole::kUser;
  std::string text;
};

}  // namespace vlm::data
