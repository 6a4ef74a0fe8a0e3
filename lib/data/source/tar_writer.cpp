#include "data/source/tar_writer.h"

#include <archive.h>
#include <archive_entry.h>

#include <memory>

#include "core/error.h"

namespace vlm::data {

TarWriter::TarWriter(const std::string& path) : path_(path), archive_(archive_write_new()) {
  archive_write_set_format_pax_restricted(archive_);
  archive_write_set_bytes_in_last_block(archive_, 1);  // no padding beyond the end records
  if (archive_write_open_filename(archive_, path.c_str()) != ARCHIVE_OK) {
    const std::string reason = archive_error_string(archive_);
    archive_write_free(archive_);
    archive_ = nullptr;
    throw DataError("cannot create the tar file: " + reason, SourceLocation{path});
  }
}

TarWriter::~TarWriter() {
  if (archive_ != nullptr) archive_write_free(archive_);
}

void TarWriter::add(const std::string& name, const void* data, size_t size) {
  std::unique_ptr<archive_entry, void (*)(archive_entry*)> entry(archive_entry_new(),
                                                                 archive_entry_free);
  archive_entry_set_pathname(entry.get(), name.c_str());
  archive_entry_set_filetype(entry.get(), AE_IFREG);
  archive_entry_set_perm(entry.get(), 0644);
  archive_entry_set_size(entry.get(), static_cast<la_int64_t>(size));
  archive_entry_set_mtime(entry.get(), 0, 0);
  if (archive_write_header(archive_, entry.get()) != ARCHIVE_OK ||
      (size > 0 && archive_write_data(archive_, data, size) != static_cast<la_ssize_t>(size))) {
    throw DataError("cannot write member '" + name + "': " + archive_error_string(archive_),
                    SourceLocation{path_});
  }
}

void TarWriter::close() {
  const int status = archive_write_close(archive_);
  const std::string reason = status == ARCHIVE_OK ? "" : archive_error_string(archive_);
  archive_write_free(archive_);
  archive_ = nullptr;
  if (status != ARCHIVE_OK) {
    throw DataError("cannot finish the tar file (is the disk full?): " + reason,
                    SourceLocation{path_});
  }
}

}  // namespace vlm::data
