//! A PostgreSQL server of the tests' own: Debian's binaries (`scripts/test` installs
//! them), a fresh cluster in a temporary directory under /tmp, listening on a Unix socket
//! in that directory only (no TCP port to race for), run as the `postgres` user when the
//! tests run as root (the server refuses root). Stopped when dropped.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A running server.
pub struct TestCluster {
    dir: tempfile::TempDir,
    bin: PathBuf,
}

/// The newest installed server's binaries.
fn server_bin() -> PathBuf {
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .expect(
            "PostgreSQL is not installed: /usr/lib/postgresql is missing (scripts/test installs \
             Debian's postgresql package)",
        )
        .filter_map(|entry| entry.ok().map(|e| e.path().join("bin")))
        .filter(|bin| bin.join("initdb").exists())
        .collect();
    versions.sort_by_key(|bin| {
        let version = bin.parent().and_then(Path::file_name);
        version.and_then(|v| v.to_str()?.parse::<u32>().ok())
    });
    versions
        .pop()
        .expect("no PostgreSQL server under /usr/lib/postgresql/*/bin")
}

fn is_root() -> bool {
    std::fs::metadata("/proc/self").is_ok_and(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
}

impl TestCluster {
    /// Creates and starts a cluster; panics with the server's output if it cannot.
    pub fn start() -> TestCluster {
        let bin = server_bin();
        // Under /tmp whatever TMPDIR says: the postgres user must reach it, and a socket
        // path must stay short.
        let dir = tempfile::Builder::new()
            .prefix("capstan-pg-")
            .tempdir_in("/tmp")
            .unwrap();
        if is_root() {
            let status = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(dir.path())
                .status()
                .unwrap();
            assert!(
                status.success(),
                "chown the cluster's directory to postgres"
            );
        }
        let cluster = TestCluster { dir, bin };
        cluster.run(
            "initdb",
            &[
                "-D",
                &cluster.data().display().to_string(),
                "-U",
                "capstan",
                "--auth=trust",
                "--encoding=UTF8",
                "--locale=C.UTF-8",
            ],
        );
        cluster.start_server();
        cluster
    }

    /// Starts the server (again, after [`TestCluster::stop`]): an outage ends.
    pub fn start_server(&self) {
        let options = format!(
            "-c listen_addresses='' -k {} -c fsync=on",
            self.dir.path().display()
        );
        self.run(
            "pg_ctl",
            &[
                "-D",
                &self.data().display().to_string(),
                "-o",
                &options,
                "-l",
                &self.dir.path().join("server.log").display().to_string(),
                "-w",
                "start",
            ],
        );
    }

    /// Stops the server with a fast shutdown: every open connection is cut and no new one
    /// is taken until [`TestCluster::start_server`], as in a database outage.
    pub fn stop(&self) {
        self.run(
            "pg_ctl",
            &[
                "-D",
                &self.data().display().to_string(),
                "-m",
                "fast",
                "-w",
                "stop",
            ],
        );
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// Restarts the server with a fast shutdown, as an operator's restart would: every
    /// open connection is cut, and committed rows survive.
    pub fn restart(&self) {
        self.run(
            "pg_ctl",
            &[
                "-D",
                &self.data().display().to_string(),
                "-l",
                &self.dir.path().join("server.log").display().to_string(),
                "-m",
                "fast",
                "-w",
                "restart",
            ],
        );
    }

    /// A command running one of the server's programs as the server's user.
    fn command(&self, program: &str) -> Command {
        let path = self.bin.join(program);
        let mut command = if is_root() {
            let mut command = Command::new("runuser");
            command.args(["-u", "postgres", "--"]).arg(&path);
            command
        } else {
            Command::new(&path)
        };
        command.current_dir("/");
        command
    }

    /// Runs one of the server's programs; panics on failure with its output and the log.
    fn run(&self, program: &str, args: &[&str]) {
        let output = self.command(program).args(args).output().unwrap();
        let log = std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default();
        assert!(
            output.status.success(),
            "{program} failed: {}\n{}\n{log}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }

    /// The URL of database `name`, through the socket.
    pub fn url(&self, name: &str) -> String {
        let socket_dir = self.dir.path().display().to_string().replace('/', "%2F");
        format!("postgres://capstan@{socket_dir}/{name}")
    }

    /// The server's socket.
    pub fn socket(&self) -> PathBuf {
        self.dir.path().join(".s.PGSQL.5432")
    }

    /// A new empty database, and its URL.
    pub async fn fresh_database(&self) -> String {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let name = format!("test_{}", NEXT.fetch_add(1, Ordering::SeqCst));
        admin(&self.url("postgres"))
            .await
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .unwrap();
        self.url(&name)
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        let _ = self
            .command("pg_ctl")
            .arg("-D")
            .arg(self.data())
            .args(["-m", "immediate", "-w", "stop"])
            .output();
    }
}

/// A plain connection to `url`, as an operator's `psql` would have.
pub async fn admin(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
}
