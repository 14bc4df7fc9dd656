//! Migrations, versioned in the repository and applied at start. A database migrated by a
//! newer postern is refused: this build would not know what its tables mean.

use deadpool_postgres::Pool;

/// The migrations this build has, in order; version N is `MIGRATIONS[N - 1]`.
const MIGRATIONS: &[&str] = &[include_str!("migrations/0001_shared.sql")];

/// A lock id of postern's own, so two nodes starting at once migrate one after the other.
const MIGRATION_LOCK: i64 = 0x706f_7374_6572_6e00;

/// Brings the schema to this build's version, or refuses a newer one.
pub async fn migrate(pool: &Pool) -> Result<(), String> {
    let mut client = pool.get().await.map_err(|e| {
        format!(
            "cannot reach the cluster store: {}",
            pg_reason(&e.to_string())
        )
    })?;
    let tx = client
        .transaction()
        .await
        .map_err(|e| format!("cluster store: {e}"))?;
    let step = async {
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
            .await?;
        tx.batch_execute("CREATE TABLE IF NOT EXISTS postern_schema (version integer NOT NULL)")
            .await?;
        let row = tx
            .query_opt("SELECT max(version) FROM postern_schema", &[])
            .await?;
        let have: i32 = row.and_then(|r| r.get::<_, Option<i32>>(0)).unwrap_or(0);
        Ok::<i32, tokio_postgres::Error>(have)
    };
    let have = step.await.map_err(|e| format!("cluster store: {e}"))?;
    let known = i32::try_from(MIGRATIONS.len()).unwrap_or(i32::MAX);
    if have > known {
        return Err(format!(
            "the cluster store's schema is version {have}, newer than this postern knows ({known}): upgrade postern"
        ));
    }
    for (n, sql) in MIGRATIONS.iter().enumerate().skip(have.max(0) as usize) {
        let version = i32::try_from(n + 1).unwrap_or(i32::MAX);
        tx.batch_execute(sql)
            .await
            .map_err(|e| format!("cluster store: migration {version} failed: {e}"))?;
        tx.execute(
            "INSERT INTO postern_schema (version) VALUES ($1)",
            &[&version],
        )
        .await
        .map_err(|e| format!("cluster store: {e}"))?;
    }
    tx.commit().await.map_err(|e| format!("cluster store: {e}"))
}

/// A pool error's words without the connection string.
fn pg_reason(e: &str) -> String {
    e.split(" for ").next().unwrap_or(e).to_owned()
}
