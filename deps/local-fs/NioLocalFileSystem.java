// Hadoop's local file system, with file permissions set through java.nio instead of a
// `chmod` process.
//
// Without Hadoop's native library (the pyspark wheel ships none), RawLocalFileSystem sets the
// permission of every file it creates and every folder it makes by forking the JVM and running
// `chmod`: each streaming micro-batch's checkpoint files (offset log, commit log, a delta file
// and its checksum per state-store partition) and each Parquet file of the archive. This class
// sets the same bits with Files.setPosixFilePermissions, in the JVM. A permission with the
// sticky bit (none of Spark's files) keeps Hadoop's own way.
//
// jobs/local_fs.py compiles it against the pyspark wheel's Hadoop client into
// .cache/jars/local-fs/; jobs/session.py puts it on a local master's class path as `fs.file.impl`.
// docs/spark.md, "A process per checkpoint file".
package streamalert.hadoop;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.attribute.PosixFilePermissions;
import org.apache.hadoop.fs.LocalFileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.permission.FsPermission;

public class NioLocalFileSystem extends LocalFileSystem {
  public NioLocalFileSystem() {
    super(new Raw());
  }

  /** The raw (checksum-less) file system under it: Hadoop's, but for setPermission. */
  public static class Raw extends RawLocalFileSystem {
    @Override
    public void setPermission(Path p, FsPermission permission) throws IOException {
      if (permission.getStickyBit()) {
        super.setPermission(p, permission);
        return;
      }
      String bits =
          permission.getUserAction().SYMBOL
              + permission.getGroupAction().SYMBOL
              + permission.getOtherAction().SYMBOL;
      Files.setPosixFilePermissions(pathToFile(p).toPath(), PosixFilePermissions.fromString(bits));
    }
  }
}
