import GRDB

/// The schema the store's tests, crash tests and benchmarks share, so that the harness's processes and the tests
/// agree on it.
package enum StoreFixtures {
    /// `item` (an id, its writer, a value) and `migration_run`, which counts how often the migration ran: two
    /// processes opening a new store at once must run it once.
    package static var itemsMigrator: DatabaseMigrator {
        var migrator = DatabaseMigrator()
        migrator.registerMigration("items") { db in
            try db.execute(sql: "CREATE TABLE item (id INTEGER PRIMARY KEY AUTOINCREMENT, writer TEXT, value INTEGER)")
            try db.execute(sql: "CREATE TABLE migration_run (id INTEGER PRIMARY KEY AUTOINCREMENT)")
            try db.execute(sql: "INSERT INTO migration_run DEFAULT VALUES")
        }
        return migrator
    }
}
