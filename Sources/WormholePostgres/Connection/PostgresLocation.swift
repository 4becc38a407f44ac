import Foundation
import NIOSSL
import PostgresNIO
import WormholeKit

/// Where a PostgreSQL server is and how to reach it, read from a `postgres://` URL as libpq reads one.
///
/// `postgres://USER:PASSWORD@HOST:PORT/DATABASE?sslmode=MODE`, with `postgresql://` accepted too. `sslmode` is
/// `disable`, `prefer` (the default, as libpq's), `require` (encrypted; the certificate is not checked unless
/// `sslrootcert` is given, when its chain is, as libpq does), `verify-ca` or `verify-full`; `sslrootcert=PATH` names
/// the certificate authorities to trust (the system's by default). A
/// `host=/directory` query item reaches the server over its Unix socket in that directory. The password never
/// appears in ``description``.
public struct PostgresLocation: Sendable, CustomStringConvertible {
    /// The connection's configuration for postgres-nio.
    public var configuration: PostgresConnection.Configuration
    /// The URL without its password, for messages and logs.
    public let description: String

    /// Reads a URL.
    ///
    /// - Throws: `WormholeError.Code.serverUnavailable` when the URL is not a PostgreSQL URL or names an unknown
    ///   `sslmode`, or the TLS configuration cannot be made.
    public init(url text: String) throws(WormholeError) {
        guard let components = URLComponents(string: text),
            let scheme = components.scheme, scheme == "postgres" || scheme == "postgresql"
        else {
            throw WormholeError(
                .serverUnavailable,
                "\"\(Self.redacting(text))\" is not a PostgreSQL URL: write postgres://USER:PASSWORD@HOST:PORT/DATABASE."
            )
        }
        let items = Dictionary(
            (components.queryItems ?? []).map { ($0.name, $0.value ?? "") },
            uniquingKeysWith: { _, last in last }
        )
        let user =
            components.user.flatMap { $0.removingPercentEncoding } ?? ProcessInfo.processInfo.environment["USER"]
            ?? "postgres"
        // libpq reads `?password=` too; so do we, and it is redacted as the other.
        let password = components.password.flatMap { $0.removingPercentEncoding } ?? items["password"]
        var database = String(components.path.drop(while: { $0 == "/" }))
        if database.isEmpty { database = user }
        let mode = items["sslmode"] ?? "prefer"
        if let socketDirectory = items["host"], socketDirectory.hasPrefix("/") {
            let port = components.port ?? 5432
            configuration = PostgresConnection.Configuration(
                unixSocketPath: socketDirectory + "/.s.PGSQL.\(port)",
                username: user,
                password: password,
                database: database
            )
        } else {
            let tls = try Self.tls(mode: mode, rootCertificates: items["sslrootcert"])
            configuration = PostgresConnection.Configuration(
                host: components.host ?? "localhost",
                port: components.port ?? 5432,
                username: user,
                password: password,
                database: database,
                tls: tls
            )
        }
        description = Self.redacting(text)
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
        mode: String,
        rootCertificates: String?
    ) throws(WormholeError)
        -> PostgresConnection
        .Configuration.TLS
    {
        var tls = TLSConfiguration.makeClientConfiguration()
        if let rootCertificates { tls.trustRoots = .file(rootCertificates) }
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
                "Unknown sslmode \"\(mode)\": use disable, prefer, require, verify-ca or verify-full."
            )
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
