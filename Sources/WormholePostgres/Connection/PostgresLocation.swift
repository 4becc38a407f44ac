import Foundation
import NIOSSL
import PostgresNIO
import WormholeKit

/// Where a PostgreSQL server is and how to reach it, read from a `postgres://` URL as libpq reads one.
///
/// `postgres://USER:PASSWORD@HOST:PORT/DATABASE?PARAMETER=VALUE&…`, with `postgresql://` accepted too. The user and
/// the password are percent-decoded once, as RFC 3986 and libpq say: a password holding `%`, `@`, `:`, `/`, `#` or
/// `?` is written `%25`, `%40`, `%3A`, `%2F`, `%23`, `%3F`. The parameters this engine reads, as libpq names them:
///
/// - `sslmode`: `disable`, `allow` and `prefer` (the default, as libpq's: encrypted when the server offers it,
///   **with no certificate checked**, so that neither a listener on the network nor a downgrade to plain text is kept
///   out), `require` (encrypted; the certificate is not checked unless `sslrootcert` is given, when its chain is, as
///   libpq does), `verify-ca` (the chain is checked) or `verify-full` (the chain and the host's name: the only mode
///   that keeps out someone on the network);
/// - `sslrootcert`: a PEM file of the authorities to trust, or `system` for the system's, which makes the default
///   `sslmode` `verify-full` and refuses a weaker one, as libpq 16 does; without it, `verify-ca` and `verify-full`
///   trust the system's authorities;
/// - `sslcert` and `sslkey`: a client certificate (PEM) and its key, for servers that ask for one (`cert` in
///   `pg_hba.conf`); one without the other is refused;
/// - `host`: a directory (`/run/postgresql`) reaches the server over its Unix socket there; a name replaces the URL's
///   host;
/// - `port`, `user`, `password`, `dbname`: as the URL's own parts, which they replace;
/// - `connect_timeout`: seconds to wait for a connection;
/// - `application_name`: the name the server shows for the connections.
///
/// Any other parameter is refused, never ignored: libpq's other keywords (`target_session_attrs`, `sslcrl`,
/// `gssencmode`…) are not supported by this engine, and a misspelt one would otherwise change nothing silently. Nor
/// can this engine insist on SCRAM: postgres-nio (1.33) answers whichever method the server asks for, so keep md5 and
/// `password` out of `pg_hba.conf`, and use `verify-full` so that nobody in between can ask. The password never
/// appears in ``description``.
public struct PostgresLocation: Sendable, CustomStringConvertible {
    /// The connection's configuration for postgres-nio.
    public var configuration: PostgresConnection.Configuration
    /// The URL without its password, for messages and logs.
    public let description: String

    /// The query parameters this engine reads; any other is refused.
    static let parameters: Set<String> = [
        "sslmode", "sslrootcert", "sslcert", "sslkey", "host", "port", "user", "password", "dbname",
        "connect_timeout", "application_name",
    ]

    /// Reads a URL.
    ///
    /// - Throws: `WormholeError.Code.serverUnavailable` when the URL is not a PostgreSQL URL, names a parameter this
    ///   engine does not read or a value it does not know, or the TLS configuration cannot be made (a certificate or
    ///   key file that cannot be read).
    public init(url text: String) throws(WormholeError) {
        let redacted = Self.redacting(text)
        guard let components = URLComponents(string: text),
            let scheme = components.scheme, scheme == "postgres" || scheme == "postgresql"
        else {
            throw WormholeError(
                .serverUnavailable,
                "\"\(redacted)\" is not a PostgreSQL URL: write postgres://USER:PASSWORD@HOST:PORT/DATABASE, with "
                    + "any % in the user or the password written %25."
            )
        }
        let items = Dictionary(
            (components.queryItems ?? []).map { ($0.name, $0.value ?? "") },
            uniquingKeysWith: { _, last in last }
        )
        if let unknown = items.keys.sorted().first(where: { !Self.parameters.contains($0) }) {
            throw WormholeError(
                .serverUnavailable,
                "The URL \"\(redacted)\" has the parameter \(unknown), which this engine does not read; it reads "
                    + Self.parameters.sorted().joined(separator: ", ") + "."
            )
        }
        // Decoded once, here: decoding again would turn a password's `%2541` into `A`, and a lone `%` into no
        // password at all. (A `%` that starts no escape is read as itself by Foundation on Linux, which encodes it
        // as `%25` while parsing; where it is not, it is refused below rather than dropped.)
        let userInURL = try Self.decoded(components.percentEncodedUser, "user name", in: redacted)
        let user = items["user"] ?? userInURL ?? ProcessInfo.processInfo.environment["USER"] ?? "postgres"
        // libpq reads `?password=` too; so do we, and it is redacted as the other.
        let passwordInURL = try Self.decoded(components.percentEncodedPassword, "password", in: redacted)
        let password = items["password"] ?? passwordInURL
        var database = items["dbname"] ?? String(components.path.drop(while: { $0 == "/" }))
        if database.isEmpty { database = user }
        let port = try Self.port(items["port"], else: components.port, in: redacted)
        var options = PostgresConnection.Configuration.Options()
        if let timeout = items["connect_timeout"] {
            // libpq: 0 or less waits for ever, which a wormhole never does; 2 is its smallest wait.
            guard let seconds = Int(timeout) else {
                throw WormholeError(.serverUnavailable, "connect_timeout must be a number of seconds, not \(timeout).")
            }
            if seconds > 0 { options.connectTimeout = .seconds(Int64(max(seconds, 2))) }
        }
        if let name = items["application_name"] {
            options.additionalStartupParameters.append(("application_name", name))
        }
        let host = items["host"] ?? components.host ?? "localhost"
        if host.hasPrefix("/") {
            configuration = PostgresConnection.Configuration(
                unixSocketPath: host + "/.s.PGSQL.\(port)",
                username: user,
                password: password,
                database: database
            )
        } else {
            let tls = try Self.tls(
                mode: items["sslmode"],
                rootCertificates: items["sslrootcert"],
                certificate: items["sslcert"],
                key: items["sslkey"]
            )
            configuration = PostgresConnection.Configuration(
                host: host,
                port: port,
                username: user,
                password: password,
                database: database,
                tls: tls
            )
        }
        configuration.options = options
        description = redacted
    }

    /// A part of the URL's authority, percent-decoded once; a `%` that starts no escape is refused.
    private static func decoded(_ part: String?, _ what: String, in url: String) throws(WormholeError) -> String? {
        guard let part else { return nil }
        guard let decoded = part.removingPercentEncoding else {
            throw WormholeError(
                .serverUnavailable,
                "The \(what) in \"\(url)\" holds a % that starts no escape: write a % in it as %25, and @ : / # ? "
                    + "as %40 %3A %2F %23 %3F."
            )
        }
        return decoded
    }

    /// The port of the `port` parameter, else of the URL, else 5432.
    private static func port(_ parameter: String?, else fromURL: Int?, in url: String) throws(WormholeError) -> Int {
        guard let parameter else { return fromURL ?? 5432 }
        guard let port = Int(parameter), (1...65535).contains(port) else {
            throw WormholeError(.serverUnavailable, "The port \(parameter) of \"\(url)\" is not a port number.")
        }
        return port
    }

    /// Creates a location from a configuration made by the caller.
    public init(configuration: PostgresConnection.Configuration) {
        self.configuration = configuration
        let place = configuration.unixSocketPath ?? "\(configuration.host ?? "?"):\(configuration.port ?? 5432)"
        description = "postgres://\(configuration.username)@\(place)/\(configuration.database ?? "")"
    }

    /// A postgres-nio `PostgresClient`'s configuration for this server, without TLS: for the tests and benchmarks,
    /// whose servers listen on a Unix socket or on loopback.
    package func plainClientConfiguration() -> PostgresClient.Configuration {
        if let socket = configuration.unixSocketPath {
            return .init(
                unixSocketPath: socket,
                username: configuration.username,
                password: configuration.password,
                database: configuration.database
            )
        }
        return .init(
            host: configuration.host ?? "localhost",
            port: configuration.port ?? 5432,
            username: configuration.username,
            password: configuration.password,
            database: configuration.database,
            tls: .disable
        )
    }

    /// The URL with its password replaced by `***`.
    ///
    /// A password that is not percent-encoded can make the URL parse another way: in
    /// `postgres://app:2024/Xy@db/app` the authority ends at the first `/`, so that there is no password, a port
    /// `2024`, and `Xy@db` in the path. An `@` that is not the one after the user name means such a password: then
    /// everything between the scheme and the last `@` is masked, as for a URL that does not parse.
    static func redacting(_ text: String) -> String {
        if var components = URLComponents(string: text) {
            let inQuery = components.queryItems?.contains { $0.name == "password" } ?? false
            let atSigns = text.split(separator: "://", maxSplits: 1).last.map { $0.count { $0 == "@" } } ?? 0
            let strayAtSign = atSigns > (components.user == nil ? 0 : 1)
            guard components.password != nil || inQuery || strayAtSign else { return text }
            if strayAtSign { return maskingAuthority(text) }
            if components.password != nil { components.password = "***" }
            components.queryItems = components.queryItems?.map {
                $0.name == "password" ? URLQueryItem(name: "password", value: "***") : $0
            }
            if let redacted = components.string { return redacted }
        }
        return maskingAuthority(text)
    }

    /// `text` with everything between the scheme and the last `@`, which may hold a password, replaced by `***`.
    private static func maskingAuthority(_ text: String) -> String {
        guard let scheme = text.range(of: "://") else { return "(a URL that does not parse)" }
        guard let at = text.range(of: "@", options: .backwards), at.lowerBound > scheme.upperBound else { return text }
        return String(text[..<scheme.upperBound]) + "***" + String(text[at.lowerBound...])
    }

    private static func tls(
        mode given: String?,
        rootCertificates: String?,
        certificate: String?,
        key: String?
    ) throws(WormholeError) -> PostgresConnection.Configuration.TLS {
        // As libpq 16: the system's authorities are named to be checked, so the default is verify-full and a weaker
        // mode a contradiction.
        let systemRoots = rootCertificates == "system"
        let mode = given ?? (systemRoots ? "verify-full" : "prefer")
        if systemRoots, mode != "verify-full" {
            throw WormholeError(
                .serverUnavailable,
                "sslmode \(mode) may not be used with sslrootcert=system: use sslmode=verify-full."
            )
        }
        var tls = TLSConfiguration.makeClientConfiguration()
        if let rootCertificates, !systemRoots { tls.trustRoots = .file(rootCertificates) }
        switch mode {
        case "disable": return .disable
        // As libpq does: `require` with a root certificate named checks the server's chain against it (as
        // `verify-ca`), since whoever names the authority to trust means it to be checked.
        case "require" where rootCertificates != nil: tls.certificateVerification = .noHostnameVerification
        case "allow", "prefer", "require": tls.certificateVerification = .none
        case "verify-ca": tls.certificateVerification = .noHostnameVerification
        case "verify-full": tls.certificateVerification = .fullVerification
        default:
            throw WormholeError(
                .serverUnavailable,
                "Unknown sslmode \"\(mode)\": use disable, allow, prefer, require, verify-ca or verify-full."
            )
        }
        switch (certificate, key) {
        case (nil, nil): break
        case (let certificate?, let key?):
            do {
                tls.certificateChain = try NIOSSLCertificate.fromPEMFile(certificate).map { .certificate($0) }
                tls.privateKey = .privateKey(try NIOSSLPrivateKey(file: key, format: .pem))
            } catch {
                throw WormholeError(
                    .serverUnavailable,
                    "The client certificate \(certificate) or its key \(key) could not be read as PEM: \(error).",
                    underlyingError: error
                )
            }
        default:
            throw WormholeError(.serverUnavailable, "sslcert and sslkey go together: give both, or neither.")
        }
        do {
            let context = try NIOSSLContext(configuration: tls)
            return mode == "allow" || mode == "prefer" ? .prefer(context) : .require(context)
        } catch {
            throw WormholeError(
                .serverUnavailable,
                "The TLS configuration for sslmode \(mode) could not be made: \(error).",
                underlyingError: error
            )
        }
    }
}
