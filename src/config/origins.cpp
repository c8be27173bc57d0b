// Where each config value came from (a file line or a --set override), so that errors found
// after everything is loaded can still point at the line that set the value at fault.
#include "config/schema.h"

namespace trident::config::detail {

void Origins::set(std::string_view path, std::string where, int rank) {
    by_path_.insert_or_assign(std::string(path), Origin{std::move(where), rank});
}

bool Origins::is_set(std::string_view path) const {
    return by_path_.find(path) != by_path_.end();
}

int Origins::rank(std::string_view path) const {
    auto it = by_path_.find(path);
    return it == by_path_.end() ? 0 : it->second.rank;
}

std::string Origins::where(std::string_view path) const {
    auto it = by_path_.find(path);
    return it == by_path_.end() ? file_ : it->second.where;
}

std::string Origins::blame(std::initializer_list<std::string_view> paths) const {
    const Origin* latest = nullptr;
    for (std::string_view path : paths) {
        auto it = by_path_.find(path);
        if (it != by_path_.end() && (!latest || it->second.rank > latest->rank))
            latest = &it->second;
    }
    return latest ? latest->where : file_;
}

}  // namespace trident::config::detail
