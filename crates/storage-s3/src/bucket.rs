//! Bucket creation for tests and setup scripts. `object_store` deliberately has no bucket API, so
//! this signs one `PUT /BUCKET` itself with `object_store`'s SigV4 signer and HTTP client.

use bytes::Bytes;
use object_store::aws::{AmazonS3, AwsAuthorizer};
use object_store::client::{HttpConnector, HttpRequestBody, ReqwestConnector};
use object_store::ClientOptions;
use strata_storage::{StorageError, StorageResult};

use crate::config::S3Config;

pub(crate) async fn create_bucket(config: &S3Config, store: &AmazonS3) -> StorageResult<()> {
    let region = config.region();
    let endpoint = config
        .endpoint()
        .unwrap_or_else(|| format!("https://s3.{region}.amazonaws.com"));
    let url = format!("{}/{}", endpoint.trim_end_matches('/'), config.bucket);
    // Outside us-east-1, AWS (and moto) want the region restated in the body.
    let body = if region == "us-east-1" {
        Bytes::new()
    } else {
        Bytes::from(format!(
            "<CreateBucketConfiguration xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">\
             <LocationConstraint>{region}</LocationConstraint></CreateBucketConfiguration>"
        ))
    };
    let mut request = http::Request::builder()
        .method(http::Method::PUT)
        .uri(url.as_str())
        .body(HttpRequestBody::from(body))
        .map_err(|err| StorageError::Invalid(format!("bucket URL {url:?}: {err}")))?;

    let credential = store
        .credentials()
        .get_credential()
        .await
        .map_err(|err| StorageError::Other(format!("no S3 credentials: {err}")))?;
    AwsAuthorizer::new(&credential, "s3", &region).authorize(&mut request, None);

    let client = ReqwestConnector::default()
        .connect(&ClientOptions::new().with_allow_http(endpoint.starts_with("http://")))
        .map_err(|err| StorageError::Other(format!("HTTP client: {err}")))?;
    let response = client
        .execute(request)
        .await
        .map_err(|err| StorageError::Unavailable(format!("PUT {url}: {err}")))?;
    let status = response.status();
    let text = match response.into_body().bytes().await {
        Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
        Err(err) => format!("(unreadable body: {err})"),
    };
    if status.is_success() || text.contains("BucketAlreadyOwnedByYou") {
        Ok(())
    } else {
        Err(StorageError::Other(format!(
            "creating bucket {} at {endpoint} failed: {status}: {text}",
            config.bucket
        )))
    }
}
