use std::str::FromStr;

use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey, S3ConditionalPut};
use object_store::RetryConfig;
use strata_storage::{ObjectKey, StorageError, StorageResult};

/// How the ETag we got back from the server is sent in `If-Match`.
///
/// RFC 9110 says an entity tag is sent quoted, exactly as received, and AWS S3 and moto insist on
/// that (moto answers 412 to an unquoted tag). Ceph RGW 16.2 compares the header against its
/// unquoted ETag instead, so the quoted form it hands out always fails with 412 there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EtagQuoting {
    /// Send the quoted form first; if the server answers 412 while the object still carries the
    /// very ETag we sent, retry once unquoted, and remember whichever form the server accepted.
    /// Costs one extra HEAD and PUT on the first compare-and-swap of a store against RGW.
    #[default]
    Auto,
    /// Always send the ETag as the server returned it (AWS S3, moto, ministack).
    Keep,
    /// Always send the ETag without quotes (Ceph RGW 16.2).
    Strip,
}

impl FromStr for EtagQuoting {
    type Err = StorageError;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        match value {
            "auto" => Ok(Self::Auto),
            "keep" | "quoted" => Ok(Self::Keep),
            "strip" | "unquoted" => Ok(Self::Strip),
            other => Err(StorageError::Invalid(format!(
                "etag_quotes must be auto, keep or strip, not {other:?}"
            ))),
        }
    }
}

/// What an `s3://` URL says, parsed and checked before anything connects.
#[derive(Debug, Clone)]
pub struct S3Config {
    /// The bucket; it must already exist (see [`crate::S3Store::create_bucket`]).
    pub bucket: String,
    /// Every key is stored under `PREFIX/`; `None` means the bucket root.
    pub prefix: Option<String>,
    /// How `If-Match` carries the ETag.
    pub etag_quoting: EtagQuoting,
    /// Whether each object ends with a [`crate::TRAILER_LEN`]-byte write-unique trailer that makes
    /// every write's ETag distinct (default). Without it, writes of identical bytes share an ETag
    /// and a compare-and-swap cannot tell them apart (ABA); turn it off only for buckets other
    /// tools must read byte-for-byte.
    pub version_trailer: bool,
    /// Keys per LIST request (`list_page_size=N`); `None` is the server's default (1000 on AWS
    /// and RGW). Small pages are for testing pagination.
    pub list_page_size: Option<usize>,
    /// `object_store` options from the query string, applied over the environment.
    pub options: Vec<(AmazonS3ConfigKey, String)>,
}

impl S3Config {
    /// Parses `s3://BUCKET[/PREFIX][?key=value&...]`.
    pub fn from_url(url: &str) -> StorageResult<Self> {
        let parsed = url::Url::parse(url)
            .map_err(|err| StorageError::Invalid(format!("bad S3 URL {url:?}: {err}")))?;
        if parsed.scheme() != "s3" {
            return Err(StorageError::Invalid(format!(
                "S3 URL must start with s3://, got {url:?}"
            )));
        }
        let bucket = parsed
            .host_str()
            .filter(|host| !host.is_empty())
            .ok_or_else(|| StorageError::Invalid(format!("S3 URL {url:?} names no bucket")))?
            .to_string();
        let prefix = parsed.path().trim_matches('/');
        let prefix = if prefix.is_empty() {
            None
        } else {
            // The prefix becomes part of every key, so it obeys the same rules as a key.
            Some(ObjectKey::new(prefix)?.as_str().to_string())
        };

        let mut etag_quoting = EtagQuoting::default();
        let mut version_trailer = true;
        let mut list_page_size = None;
        let mut options = Vec::new();
        for (name, value) in parsed.query_pairs() {
            match name.as_ref() {
                "etag_quotes" => {
                    etag_quoting = value.parse()?;
                    continue;
                }
                "version_trailer" => {
                    version_trailer = value.parse().map_err(|_| {
                        StorageError::Invalid(format!(
                            "version_trailer must be true or false, not {value:?}"
                        ))
                    })?;
                    continue;
                }
                "list_page_size" => {
                    list_page_size =
                        Some(value.parse().ok().filter(|n| *n > 0).ok_or_else(|| {
                            StorageError::Invalid(format!(
                                "list_page_size must be a positive integer, not {value:?}"
                            ))
                        })?);
                    continue;
                }
                _ => {}
            }
            let key = AmazonS3ConfigKey::from_str(&name).map_err(|_| {
                StorageError::Invalid(format!("unknown S3 URL option {name:?} in {url:?}"))
            })?;
            if matches!(key, AmazonS3ConfigKey::Bucket) {
                return Err(StorageError::Invalid(
                    "the bucket is the URL's host, not an option".to_string(),
                ));
            }
            options.push((key, value.into_owned()));
        }
        Ok(Self {
            bucket,
            prefix,
            etag_quoting,
            version_trailer,
            list_page_size,
            options,
        })
    }

    /// The `object_store` builder: environment first, then the URL's options, then the settings
    /// this backend depends on for correctness.
    pub(crate) fn builder(&self) -> AmazonS3Builder {
        let mut builder = AmazonS3Builder::from_env()
            // Local servers and RGW are reached by IP, so bucket-in-hostname cannot work; a URL
            // option can still turn it on for AWS.
            .with_virtual_hosted_style_request(false);
        for (key, value) in &self.options {
            builder = builder.with_config(*key, value.clone());
        }
        builder
            .with_bucket_name(self.bucket.clone())
            // Fencing depends on If-None-Match / If-Match; an AWS_CONDITIONAL_PUT=disabled in the
            // environment must not silently turn create-only into overwrite.
            .with_conditional_put(S3ConditionalPut::ETagMatch)
            // object_store would retry 5xx and connection errors — including a conditional PUT
            // that may already have landed, whose retry then reports our own write as a conflict.
            // Strata's retry wrapper owns retries; here every failure surfaces once, classified.
            .with_retry(RetryConfig {
                max_retries: 0,
                ..RetryConfig::default()
            })
    }

    /// The endpoint requests go to, for messages and for the bucket helper.
    pub(crate) fn endpoint(&self) -> Option<String> {
        self.builder()
            .get_config_value(&AmazonS3ConfigKey::Endpoint)
    }

    /// The region requests are signed for.
    pub(crate) fn region(&self) -> String {
        self.builder()
            .get_config_value(&AmazonS3ConfigKey::Region)
            .unwrap_or_else(|| "us-east-1".to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_bucket_prefix_and_options() {
        let config = S3Config::from_url(
            "s3://strata/test/run1?endpoint=http://127.0.0.1:9310&region=us-east-1&allow_http=true",
        )
        .unwrap();
        assert_eq!(config.bucket, "strata");
        assert_eq!(config.prefix.as_deref(), Some("test/run1"));
        assert_eq!(config.etag_quoting, EtagQuoting::Auto);
        assert!(config.version_trailer);
        assert_eq!(config.options.len(), 3);
        assert_eq!(config.endpoint().as_deref(), Some("http://127.0.0.1:9310"));
    }

    #[test]
    fn bucket_root_has_no_prefix() {
        let config =
            S3Config::from_url("s3://strata?etag_quotes=strip&version_trailer=false").unwrap();
        assert_eq!(config.prefix, None);
        assert!(!config.version_trailer);
        assert_eq!(config.etag_quoting, EtagQuoting::Strip);
        let config = S3Config::from_url("s3://strata/").unwrap();
        assert_eq!(config.prefix, None);
    }

    #[test]
    fn rejects_what_it_cannot_honour() {
        for bad in [
            "http://strata/x",
            "s3:///x",
            "s3://strata/a//b",
            "s3://strata/x?no_such_option=1",
            "s3://strata/x?etag_quotes=sometimes",
            "s3://strata/x?version_trailer=yes",
            "s3://strata/x?list_page_size=0",
            "s3://strata/x?bucket=other",
        ] {
            assert!(
                matches!(S3Config::from_url(bad), Err(StorageError::Invalid(_))),
                "{bad:?} accepted"
            );
        }
    }
}
